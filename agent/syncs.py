"""Count host synchronizations and the code sites that cause them.

Default backend ("debug-mode"): PyTorch's sync debug mode makes every implicit synchronizing
operation (``.item()``, ``.tolist()``, ``nonzero``, a blocking device-to-host copy...) raise a
warning; we intercept exactly those warnings and count them. Explicit ``torch.cuda.synchronize``,
``torch.accelerator.synchronize``, ``torch.cuda.Event.synchronize`` and
``torch.cuda.Stream.synchronize`` calls are wrapped. The generic ``torch.Event`` and
``torch.Stream`` are immutable C types that cannot be wrapped: their ``synchronize()`` is seen
by the CUPTI backend only. Each sync is attributed to the first stack frame outside torch and
outside packscope.agent, as ``file:line``.

The counter never changes what the program does: other warnings pass through untouched, and
uninstall restores everything.

Counting can be switched off and on (``set_counting``): the agent counts one interval in a few
(``AgentConfig.count_syncs_every``), because a sync counted in debug mode costs the trainer tens
of µs in PyTorch's own warning path (docs/agent.md, "Host synchronizations"). Off, the debug mode
is off too, so an uncounted sync costs nothing.
"""

from __future__ import annotations

import os
import sys
import threading
import warnings
from collections import Counter

import torch

SYNC_WARNING = "called a synchronizing CUDA operation"
WARN = 1  # the sync debug mode "warn", as torch.cuda.get_sync_debug_mode answers it
_TORCH_DIR = os.path.dirname(torch.__file__)
_AGENT_DIR = os.path.dirname(__file__)
_SKIP_DIRS = (_TORCH_DIR, _AGENT_DIR, os.path.dirname(warnings.__file__))


# Per source file: its base name, or None for a file whose frames are skipped. A trainer that
# syncs a hundred times a step pays this walk a hundred times: each file is judged once.
_FILE_SITE: dict[str, str | None] = {}


def _file_site(path: str) -> str | None:
    skipped = path.startswith(_SKIP_DIRS) or path.startswith("<frozen")
    site = _FILE_SITE[path] = None if skipped else os.path.basename(path)
    return site


def caller_site(frame=None) -> str:
    """``file:line`` of the first frame outside torch, the agent and the warnings module."""
    f = frame or sys._getframe(1)
    while f is not None:
        path = f.f_code.co_filename
        site = _FILE_SITE[path] if path in _FILE_SITE else _file_site(path)
        if site is not None:
            return f"{site}:{f.f_lineno}"
        f = f.f_back
    return "<unknown>"


class SyncCounter:
    """Counts syncs since install; ``snapshot()`` gives (total, Counter of sites)."""

    def __init__(self) -> None:
        self.total = 0
        self.sites: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._inside_wrapper = threading.local()
        self._saved: dict = {}
        self.installed = False
        self.counting = True  # False between set_counting(False) and set_counting(True)

    def record(self, site: str) -> None:
        if not self.counting:
            return
        with self._lock:
            self.total += 1
            self.sites[site] += 1

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
        # PyTorch's switch: "warn" while counting, else the mode install() found; a mode the
        # program has set since is the program's, and stays.
        found = self._saved["debug_mode"]
        current, wanted = (found, WARN) if on else (WARN, found)
        if torch.cuda.get_sync_debug_mode() == current:
            torch.cuda.set_sync_debug_mode(wanted)

    # -- debug-mode warnings -----------------------------------------------------------------
    def _showwarning(self, message, category, filename, lineno, file=None, line=None):
        if SYNC_WARNING in str(message) and self.counting:
            if not getattr(self._inside_wrapper, "active", False):
                self.record(caller_site())
            return
        self._saved["showwarning"](message, category, filename, lineno, file, line)

    def _wrap(self, owner, name: str) -> None:
        original = getattr(owner, name)
        counter = self

        def synchronize(*args, **kwargs):
            if counter.counting:
                counter.record(caller_site())
            # The debug mode may also flag this call; it is counted once, here.
            counter._inside_wrapper.active = True
            try:
                return original(*args, **kwargs)
            finally:
                counter._inside_wrapper.active = False

        synchronize.__wrapped__ = original  # type: ignore[attr-defined]
        self._saved[(owner, name)] = original
        setattr(owner, name, synchronize)

    def install(self) -> SyncCounter:
        if self.installed or not torch.cuda.is_available():
            return self
        self._saved["debug_mode"] = torch.cuda.get_sync_debug_mode()
        self._saved["showwarning"] = warnings.showwarning
        self._saved["filters"] = list(warnings.filters)
        warnings.filterwarnings("always", message=f".*{SYNC_WARNING}.*")
        warnings.showwarning = self._showwarning
        if self.counting:
            torch.cuda.set_sync_debug_mode(WARN)
        self._wrap(torch.cuda, "synchronize")
        self._wrap(torch.accelerator, "synchronize")
        self._wrap(torch.cuda.Event, "synchronize")
        self._wrap(torch.cuda.Stream, "synchronize")
        self.installed = True
        return self

    def uninstall(self) -> None:
        if not self.installed:
            return
        for key, original in list(self._saved.items()):
            if isinstance(key, tuple):
                setattr(key[0], key[1], original)
        torch.cuda.set_sync_debug_mode(self._saved["debug_mode"])
        warnings.showwarning = self._saved["showwarning"]
        warnings.filters[:] = self._saved["filters"]  # type: ignore[index]  # restoring what install() copied
        self._saved.clear()
        self.installed = False
