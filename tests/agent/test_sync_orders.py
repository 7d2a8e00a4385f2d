"""Several sync counters in one process, as a notebook or a sweep makes them (one agent after
another, overlapping, some never closed): in every order of installs and uninstalls, each
installed counter counts every sync once, other warnings reach the program's own handler, and
once the last counter is uninstalled the process is as the first install found it. Debug mode
on the CPU as tests/agent/test_syncs.py does it (PyTorch's warning simulated from a file inside
torch); CUPTI through a stand-in for cupti-python that, like CUPTI, takes one subscriber."""

from __future__ import annotations

import enum
import itertools
import os
import types
import warnings
from collections.abc import Iterator
from unittest import mock

import pytest
import torch

from packscope.agent.cupti import CuptiSyncCounter
from packscope.agent.syncs import SYNC_WARNING, WARN, SyncCounter

COUNTERS = "ABC"
# What the debug-mode counter wraps besides torch.cuda.synchronize.
OTHER_WRAPPED = (
    (torch.accelerator, "synchronize"),
    (torch.cuda.Event, "synchronize"),
    (torch.cuda.Stream, "synchronize"),
)
WRAPPED = ((torch.cuda, "synchronize"), *OTHER_WRAPPED)


def schedules() -> Iterator[tuple[tuple[str, str], ...]]:
    """Every order of the counters' installs and uninstalls (an uninstall after its install), with
    every choice of counters that are never uninstalled."""
    for closed in itertools.product((True, False), repeat=len(COUNTERS)):
        events = [(c, "install") for c in COUNTERS]
        events += [(c, "uninstall") for c, close in zip(COUNTERS, closed, strict=True) if close]
        for order in sorted(set(itertools.permutations(events))):
            if all(order.index((c, "install")) < order.index((c, "uninstall")) for c, _ in events if _ == "uninstall"):
                yield order


SCHEDULES = list(schedules())


def _name(schedule) -> str:
    return " ".join(f"{c}{'+' if what == 'install' else '-'}" for c, what in schedule)


def test_the_schedules_are_every_order():
    # 3 closed: 6!/2^3 orders; 2 closed (3 ways): 5!/2^2; 1 closed (3 ways): 4!/2; none: 3!
    assert len(SCHEDULES) == len(set(SCHEDULES)) == 90 + 3 * 30 + 3 * 12 + 6


def _from_torch(source: str) -> dict:
    namespace: dict = {"torch": torch, "warnings": warnings, "MESSAGE": SYNC_WARNING}
    exec(compile(source, os.path.join(os.path.dirname(torch.__file__), "fake_op.py"), "exec"), namespace)
    return namespace


# An op PyTorch flags in its sync debug mode "warn", as it does: a warning, only in that mode.
flagged_op = _from_torch(
    "def item():\n    if torch.cuda.get_sync_debug_mode() == 1:\n        warnings.warn(MESSAGE, UserWarning)\n"
)["item"]


class Process:
    """What the counters share: torch's debug mode and wrapped functions, and warnings' hooks."""

    def __init__(self) -> None:
        self.mode = 0
        self.device_wait = mock.Mock(name="synchronize")
        self.shown = mock.Mock(name="showwarning")

    def __enter__(self) -> Process:
        self._patches = [
            mock.patch("torch.cuda.is_available", return_value=True),
            mock.patch("torch.cuda.get_sync_debug_mode", side_effect=lambda: self.mode),
            mock.patch("torch.cuda.set_sync_debug_mode", side_effect=self._set_mode),
            mock.patch("torch.cuda.synchronize", self.device_wait),
            # The other wrapped functions, so that a counter left installed leaves nothing behind.
            *(mock.patch.object(owner, name, mock.Mock()) for owner, name in OTHER_WRAPPED),
            warnings.catch_warnings(),
        ]
        for patch in self._patches:
            patch.__enter__()
        warnings.simplefilter("always")  # so that each warning of the program's reaches its handler
        warnings.showwarning = self.shown
        self.filters = list(warnings.filters)
        self.wrapped = [getattr(owner, name) for owner, name in WRAPPED]
        return self

    def __exit__(self, *exc) -> None:
        for patch in reversed(self._patches):
            patch.__exit__(*exc)

    def _set_mode(self, mode) -> None:
        self.mode = mode

    def as_found(self) -> bool:
        return (
            warnings.showwarning is self.shown
            and warnings.filters == self.filters
            and [getattr(owner, name) for owner, name in WRAPPED] == self.wrapped
            and self.mode == 0
        )


def check_debug_mode(process: Process, counters: dict[str, SyncCounter], installed: set[str]) -> None:
    before = {name: c.snapshot()[0] for name, c in counters.items()}
    flagged_op()
    torch.cuda.synchronize()
    warnings.warn("the program's own warning", UserWarning, stacklevel=1)
    after = {name: c.snapshot()[0] for name, c in counters.items()}
    assert after == {name: before[name] + 2 * (name in installed) for name in counters}
    assert process.device_wait.call_count == 1
    process.device_wait.reset_mock()
    process.shown.assert_called_once()
    assert str(process.shown.call_args.args[0]) == "the program's own warning"
    process.shown.reset_mock()
    assert process.mode == (WARN if installed else 0)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=_name)
def test_debug_mode_counters_in_every_order(schedule):
    with Process() as process:
        counters = {name: SyncCounter() for name in COUNTERS}
        installed: set[str] = set()
        for name, what in schedule:
            getattr(counters[name], what)()
            (installed.add if what == "install" else installed.discard)(name)
            check_debug_mode(process, counters, installed)
        for name in sorted(installed):  # the agents never closed, closed at last
            counters[name].uninstall()
        assert process.as_found()
        check_debug_mode(process, counters, set())


def test_the_reported_crash_a_warning_after_two_agents_closed_out_of_order():
    """Two Trainers in a row: A installs, B installs, A uninstalls, B uninstalls; the program's
    next warning raised KeyError('showwarning') from A's cleared hook."""
    with Process() as process:
        a, b = SyncCounter().install(), SyncCounter().install()
        a.uninstall()
        b.uninstall()
        warnings.warn("the next Trainer's first warning", UserWarning, stacklevel=1)
        process.shown.assert_called_once()
        assert process.as_found()


def test_counting_switches_follow_every_installed_counter():
    with Process() as process:
        a, b = SyncCounter().install(), SyncCounter().install()
        a.set_counting(False)
        assert process.mode == WARN  # b still counts
        flagged_op()
        assert (a.snapshot()[0], b.snapshot()[0]) == (0, 1)
        b.set_counting(False)
        assert process.mode == 0  # nobody counts: an uncounted sync is not even flagged
        a.set_counting(True)
        assert process.mode == WARN
        b.uninstall()
        a.set_counting(False)
        process.mode = 2  # the program asks for errors on syncs: its choice stays
        a.set_counting(True)
        assert process.mode == 2
        a.uninstall()
        assert process.as_found()


def test_a_hook_the_program_put_over_ours_stays_and_counts_once():
    with Process() as process:
        a = SyncCounter().install()
        ours = warnings.showwarning

        def program_hook(*args):
            ours(*args)

        warnings.showwarning = program_hook
        a.uninstall()
        assert warnings.showwarning is program_hook  # not ours to take off
        warnings.warn("passes through ours", UserWarning, stacklevel=1)
        process.shown.assert_called_once()
        b = SyncCounter().install()
        flagged_op()
        torch.cuda.synchronize()
        assert b.snapshot()[0] == 2
        b.uninstall()
        assert warnings.showwarning is program_hook and process.mode == 0


class FakeCupti:
    """cupti-python's ``cupti`` module as the counter uses it; like CUPTI, one subscriber at once."""

    class cuptiError(Exception):
        def __init__(self, status) -> None:
            super().__init__(status)
            self.status = status

    class Result(enum.IntEnum):
        ERROR_INVALID_PARAMETER = 1
        ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED = 39

    class ApiCallbackSite(enum.IntEnum):
        API_ENTER = 0
        API_EXIT = 1

    class CallbackDomain(enum.IntEnum):
        DRIVER_API = 1

    driver_api_trace_cbid = types.SimpleNamespace(cuCtxSynchronize=17)
    SUBSCRIBER_PARAMS_SIZE = 64

    def __init__(self) -> None:
        self.callback = None

    def SubscriberParams(self):
        return types.SimpleNamespace(ptr=0)

    def subscribe_v2(self, callback, userdata, params):
        if self.callback is not None:
            raise self.cuptiError(self.Result.ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED)
        self.callback = callback
        return 1

    def enable_callback(self, enable, subscriber, domain, cbid) -> None:
        pass

    def unsubscribe(self, subscriber) -> None:
        self.callback = None

    def context_synchronize(self) -> None:
        """cuCtxSynchronize as the subscriber sees it, on entry."""
        if self.callback is not None:
            entry = types.SimpleNamespace(callback_site=self.ApiCallbackSite.API_ENTER)
            self.callback(None, self.CallbackDomain.DRIVER_API, 17, entry)


@pytest.mark.parametrize("schedule", SCHEDULES, ids=_name)
def test_cupti_counters_in_every_order(schedule):
    fake = FakeCupti()
    package = types.ModuleType("cupti")
    package.cupti = fake  # type: ignore[attr-defined]
    with mock.patch.dict("sys.modules", {"cupti": package}), mock.patch("ctypes.CDLL"):
        counters = {name: CuptiSyncCounter() for name in COUNTERS}
        installed: set[str] = set()
        for name, what in schedule:
            getattr(counters[name], what)()
            (installed.add if what == "install" else installed.discard)(name)
            before = {n: c.snapshot()[0] for n, c in counters.items()}
            fake.context_synchronize()
            after = {n: c.snapshot()[0] for n, c in counters.items()}
            assert after == {n: before[n] + (n in installed) for n in counters}
            assert (fake.callback is not None) == bool(installed)
        for name in sorted(installed):
            counters[name].uninstall()
        assert fake.callback is None  # unsubscribed: CUPTI is free for a profiler again
