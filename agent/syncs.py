"""Count host synchronizations and the code sites that cause them.

Default backend ("debug-mode"): PyTorch's sync debug mode makes every implicit synchronizing
operation (``.item()``, ``.tolist()``, ``nonzero``, a blocking device-to-host copy...) raise a
warning; we intercept exactly those warnings and count them. Explicit ``torch.cuda.synchronize``,
``torch.accelerator.synchronize``, ``torch.cuda.Event.synchronize`` and
``torch.cuda.Stream.synchronize`` calls are wrapped. The generic ``torch.Event`` and
``torch.Stream`` are immutable C types that cannot be wrapped: their ``synchronize()`` is seen
by the CUPTI backend only. Each sync is attributed to the first stack frame outside torch and
outside packscope.agent, as ``path:line in function`` (sync_sites.py).

The counter never changes what the program does: other warnings pass through untouched, and
the last uninstall restores everything.

The hooks (``warnings.showwarning``, the warnings filter, the wrapped functions, the debug mode)
belong to the process, not to a counter: the first counter installed puts them in place, every
installed counter counts through them, and the last one uninstalled takes them off, in whatever
order the counters come and go (a notebook or a sweep runs many agents in one process, some
never closed). A hook that the program has wrapped since stays in its chain and lets everything
through once no counter is installed.

Counting can be switched off and on (``set_counting``): the agent counts one interval in a few
(``AgentConfig.count_syncs_every``), because a sync counted in debug mode costs the trainer tens
of µs in PyTorch's own warning path (docs/agent.md, "Host synchronizations"). Off, the debug mode
is off too (while no other installed counter counts), so an uncounted sync costs nothing.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections import Counter
from collections.abc import Callable

import torch

from packscope.agent.sync_sites import caller_site

SYNC_WARNING = "called a synchronizing CUDA operation"
WARN = 1  # the sync debug mode "warn", as torch.cuda.get_sync_debug_mode answers it


class SyncCounter:
    """Counts syncs since install; ``snapshot()`` gives (total, Counter of sites)."""

    def __init__(self) -> None:
        self.total = 0
        self.sites: Counter[str] = Counter()
        self._lock = threading.Lock()
        self.installed = False
        self.counting = True  # False between set_counting(False) and set_counting(True)
        # While the agent traces steps (docs/ledger.md): each sync's site with its time on the
        # tracer's clock (`clock`), for gpu_idle to charge idle time to.
        self.marks: list[tuple[int, str]] | None = None
        self.clock: Callable[[], int] | None = None

    def record(self, site: str) -> None:
        if not self.counting:
            return
        with self._lock:
            self.total += 1
            self.sites[site] += 1
            marks, clock = self.marks, self.clock
            if marks is not None and clock is not None:
                marks.append((clock(), site))

    def snapshot(self) -> tuple[int, Counter]:
        with self._lock:
            return self.total, Counter(self.sites)

    def set_counting(self, on: bool) -> None:
        """Count the syncs from now on, or leave them uncounted (and, in debug mode, unflagged)."""
        if on == self.counting:
            return
        self.counting = on
        if self.installed:
            self._counting_switched(on)

    def _counting_switched(self, on: bool) -> None:
        _hooks.switch_debug_mode()

    def install(self) -> SyncCounter:
        if self.installed or not torch.cuda.is_available():
            return self
        _hooks.attach(self)
        self.installed = True
        return self

    def uninstall(self) -> None:
        if not self.installed:
            return
        _hooks.detach(self)
        self.installed = False


class _ProcessHooks:
    """The debug-mode hooks of the process, shared by every installed SyncCounter."""

    WRAPPED = (
        (torch.cuda, "synchronize"),
        (torch.accelerator, "synchronize"),
        (torch.cuda.Event, "synchronize"),
        (torch.cuda.Stream, "synchronize"),
    )

    def __init__(self) -> None:
        # Replaced, never mutated: the hooks read it without the lock.
        self.counters: tuple[SyncCounter, ...] = ()
        self._lock = threading.Lock()
        self._inside_wrapper = threading.local()
        self._ours: weakref.WeakSet[Callable] = weakref.WeakSet()  # every hook we have put in place
        self._found_mode = 0  # the debug mode the first counter found
        self._filter: tuple | None = None  # our entry in warnings.filters

    def counting(self) -> bool:
        return any(counter.counting for counter in self.counters)

    def record(self, site: str) -> None:
        for counter in self.counters:
            counter.record(site)

    # -- a counter comes or goes ---------------------------------------------------------------
    def attach(self, counter: SyncCounter) -> None:
        with self._lock:
            if not self.counters:
                self._found_mode = torch.cuda.get_sync_debug_mode()
            self.counters = (*self.counters, counter)
            self._put_in_place()
            self._switch_debug_mode()

    def detach(self, counter: SyncCounter) -> None:
        with self._lock:
            self.counters = tuple(c for c in self.counters if c is not counter)
            if self.counters:
                self._switch_debug_mode()
                return
            self._take_off()
            torch.cuda.set_sync_debug_mode(self._found_mode)

    def switch_debug_mode(self) -> None:
        with self._lock:
            self._switch_debug_mode()

    def _switch_debug_mode(self) -> None:
        # PyTorch's switch: "warn" while a counter counts, else the mode the first counter found;
        # a mode the program has set since is the program's, and stays.
        current, wanted = (self._found_mode, WARN) if self.counting() else (WARN, self._found_mode)
        if torch.cuda.get_sync_debug_mode() == current:
            torch.cuda.set_sync_debug_mode(wanted)

    def _put_in_place(self) -> None:
        """Our hooks on top, where they are not already (the first install, or something the
        program put over them since); one under a program's own hook stays as it is."""
        if self._filter is None or self._filter not in warnings.filters:
            warnings.filterwarnings("always", message=f".*{SYNC_WARNING}.*")
            self._filter = warnings.filters[0]
        if warnings.showwarning not in self._ours:
            warnings.showwarning = self._own(self._showwarning_over(warnings.showwarning))
        for owner, name in self.WRAPPED:
            if getattr(owner, name) not in self._ours:
                setattr(owner, name, self._own(self._synchronize_over(getattr(owner, name))))

    def _take_off(self) -> None:
        """Restore what each hook of ours on top replaced; ours under a hook of the program's
        stay in its chain, passing everything through."""
        while warnings.showwarning in self._ours:
            warnings.showwarning = warnings.showwarning.__wrapped__  # type: ignore[attr-defined]
        for owner, name in self.WRAPPED:
            while getattr(owner, name) in self._ours:
                setattr(owner, name, getattr(owner, name).__wrapped__)
        if self._filter in warnings.filters:
            warnings.filters.remove(self._filter)  # type: ignore[attr-defined]  # a list; "always" keeps no registry entry to reset

    def _own(self, hook: Callable) -> Callable:
        self._ours.add(hook)
        return hook

    # -- the hooks -------------------------------------------------------------------------------
    def _showwarning_over(self, previous: Callable) -> Callable:
        def showwarning(message, category, filename, lineno, file=None, line=None):
            if SYNC_WARNING in str(message) and self.counting():
                if not getattr(self._inside_wrapper, "active", False):
                    self.record(caller_site())
                return
            previous(message, category, filename, lineno, file, line)

        showwarning.__wrapped__ = previous  # type: ignore[attr-defined]
        return showwarning

    def _synchronize_over(self, original: Callable) -> Callable:
        inside = self._inside_wrapper

        def synchronize(*args, **kwargs):
            if getattr(inside, "active", False):  # a wrapper of ours further out counted this call
                return original(*args, **kwargs)
            if self.counting():
                self.record(caller_site())
            # The debug mode may also flag this call; it is counted once, here.
            inside.active = True
            try:
                return original(*args, **kwargs)
            finally:
                inside.active = False

        synchronize.__wrapped__ = original  # type: ignore[attr-defined]
        return synchronize


_hooks = _ProcessHooks()
