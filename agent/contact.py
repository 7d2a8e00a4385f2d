"""The small requests the sender thread makes beside the interval records (backend/ingest/contact.py):

* a heartbeat every ``every_s`` seconds, so that the server can tell a run whose process died
  (shown stale, then crashed) from one that is between intervals;
* the run's findings about its batches (the layout they had, the baseline's pack length), as a
  PATCH once they are known and whenever they change;
* the intervals that will never be stored, refused by the agent (inconsistent batch input) or by
  the server (a 4xx), with the reason, so that the run page says why it is empty.

The training thread only calls ``update`` and ``refuse`` (a lock held for a dict update); the
sender thread calls ``tick`` on each turn of its loop and ``flush`` before the final status. A
failed request is tried again later; nothing here raises into either thread's caller.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("packscope.agent")

# request(method, path under the run, body): the sender's, which registers the run first and
# raises on a failed request.
Request = Callable[[str, str, dict[str, Any]], object]
MAX_REFUSALS = 1000  # per request, as the server takes them


class RunContact:
    def __init__(self, every_s: float) -> None:
        self.every_s = every_s  # 0: no heartbeat
        self._next_beat = 0.0  # monotonic; 0: the first turn beats (and registers the run) at once
        self._next_retry = 0.0
        self._lock = threading.Lock()
        self._patch: dict[str, Any] = {}
        self._refusals: list[dict[str, Any]] = []
        self.beats = 0  # heartbeats the server took
        self.failures = 0  # requests that failed (tried again later)

    # -- any thread ----------------------------------------------------------------------------
    def update(self, **fields: Any) -> None:
        """Fields of the run to PATCH (layout, pack_length, status...), merged with those pending."""
        with self._lock:
            self._patch.update(fields)

    def refuse(self, refusal: dict[str, Any]) -> None:
        """An interval that will never be stored: interval, rank, first_step, last_step, by, reason."""
        with self._lock:
            self._refusals.append(refusal)

    def pending(self) -> bool:
        with self._lock:
            return bool(self._patch or self._refusals)

    # -- the sender thread ---------------------------------------------------------------------
    def tick(self, request: Request) -> None:
        """One turn: the pending PATCH and refusals, and the heartbeat when it is due."""
        now = time.monotonic()
        if now >= self._next_retry:
            self.flush(request)
        if self.every_s and now >= self._next_beat:
            self._next_beat = now + self.every_s
            if self._send(request, "POST", "/heartbeat", {"every_s": self.every_s}):
                self.beats += 1

    def flush(self, request: Request) -> bool:
        """Send what is pending now; True when nothing is left."""
        with self._lock:
            patch, self._patch = self._patch, {}
            refusals, self._refusals = self._refusals, []
        ok = True
        if patch and not self._send(request, "PATCH", "", patch):
            with self._lock:
                self._patch = {**patch, **self._patch}  # values set meanwhile are newer
            ok = False
        for start in range(0, len(refusals), MAX_REFUSALS):
            chunk = refusals[start : start + MAX_REFUSALS]
            if not self._send(request, "POST", "/refusals", {"refusals": chunk}):
                with self._lock:
                    self._refusals[:0] = refusals[start:]
                ok = False
                break
        if not ok:
            self._next_retry = time.monotonic() + max(self.every_s, 2.0)
        return ok

    def _send(self, request: Request, method: str, path: str, body: dict[str, Any]) -> bool:
        try:
            request(method, path, body)
            return True
        except Exception as exc:  # noqa: BLE001 - the sender's ServerError, or anything on the way
            self.failures += 1
            log.debug("packscope: %s run%s failed (%s); tried again later", method, path, exc)
            return False
