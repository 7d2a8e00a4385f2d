"""The debug-mode sync counter's attribution, on the CPU: PyTorch's sync warning is simulated (the
real one needs CUDA; tests/gpu/test_gpu_agent.py counts real syncs), the rest is the counter's own
code path: its warnings filter and handler, and the walk to the first frame outside torch."""

import os
import sys
import warnings
from unittest import mock

import pytest
import torch

from packscope.agent.sync_sites import caller_site, shown_path
from packscope.agent.syncs import SYNC_WARNING, SyncCounter

TORCH_MESSAGE = f"{SYNC_WARNING} (Triggered internally at /pytorch/c10/cuda/CUDAFunctions.cpp:147.)"


def _from_torch(source: str) -> dict:
    """Functions compiled as if they were a file inside torch, whose frames the counter skips."""
    namespace: dict = {"caller_site": caller_site, "warnings": warnings, "MESSAGE": TORCH_MESSAGE}
    exec(compile(source, os.path.join(os.path.dirname(torch.__file__), "fake_op.py"), "exec"), namespace)
    return namespace


def _line() -> int:
    return sys._getframe(1).f_lineno


HERE = shown_path(__file__)  # tests/agent/test_syncs.py, run from the checkout (test_sync_sites.py)


def test_the_site_is_the_first_frame_outside_torch():
    inside = _from_torch("def op():\n    return caller_site()\n")["op"]
    line = _line() + 1
    assert inside() == f"{HERE}:{line} in test_the_site_is_the_first_frame_outside_torch"
    line = _line() + 1
    site = caller_site()  # called from here: this file is the site
    assert site == f"{HERE}:{line} in test_the_site_is_the_first_frame_outside_torch"


@pytest.fixture
def shown():
    """The program's own warnings.showwarning, which the counter chains to."""
    with (
        mock.patch("torch.cuda.is_available", return_value=True),
        mock.patch("torch.cuda.get_sync_debug_mode", return_value=0),
        mock.patch("torch.cuda.set_sync_debug_mode"),
        warnings.catch_warnings(),
    ):
        warnings.showwarning = shown = mock.Mock()
        yield shown


@pytest.fixture
def counter(shown):
    """A SyncCounter installed as on CUDA, with torch's debug-mode switch stubbed out."""
    counter = SyncCounter().install()
    yield counter
    counter.uninstall()


def test_every_sync_warning_is_counted_at_its_site_and_other_warnings_pass(counter, shown):
    sync = _from_torch("def item():\n    warnings.warn(MESSAGE, UserWarning)\n")["item"]
    for _ in range(3):
        line = _line() + 1
        sync()  # the same place three times: counted three times, not once as Python would show it
    other = _from_torch("def other():\n    warnings.warn('something else', UserWarning)\n")["other"]
    other()
    shown.assert_called_once()
    total, sites = counter.snapshot()
    assert total == 3
    assert sites == {f"{HERE}:{line} in test_every_sync_warning_is_counted_at_its_site_and_other_warnings_pass": 3}


def test_counting_off_switches_the_debug_mode_off_and_back_and_keeps_a_mode_the_program_set():
    mode = {"now": 0}  # torch's debug mode, as its getter and setter see it
    device_wait = mock.Mock()  # torch.cuda.synchronize, which the counter wraps
    with (
        mock.patch("torch.cuda.synchronize", device_wait),
        mock.patch("torch.cuda.is_available", return_value=True),
        mock.patch("torch.cuda.get_sync_debug_mode", side_effect=lambda: mode["now"]),
        mock.patch("torch.cuda.set_sync_debug_mode", side_effect=lambda m: mode.update(now=m)),
        warnings.catch_warnings(),
    ):
        counter = SyncCounter().install()
        sync = _from_torch("def item():\n    warnings.warn(MESSAGE, UserWarning)\n")["item"]
        assert mode["now"] == 1  # warn
        counter.set_counting(False)
        assert mode["now"] == 0  # the mode install() found: an uncounted sync is not even flagged
        with pytest.warns(UserWarning, match=SYNC_WARNING):
            sync()  # had the program flagged it in a mode of its own, the warning would be its own
        torch.cuda.synchronize()  # the wrapper: the call goes through, uncounted
        assert counter.snapshot()[0] == 0 and device_wait.call_count == 1
        counter.set_counting(True)
        assert mode["now"] == 1
        sync()
        torch.cuda.synchronize()
        assert counter.snapshot()[0] == 2 and device_wait.call_count == 2
        counter.set_counting(False)
        mode["now"] = 2  # the program asks for errors on syncs: its choice stays
        counter.set_counting(True)
        assert mode["now"] == 2
        counter.uninstall()
        assert mode["now"] == 0
