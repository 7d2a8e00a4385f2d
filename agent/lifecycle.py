"""A run whose process is ended marks itself failed, where the process lets it.

* SIGTERM (a scheduler's stop, torchrun tearing workers down, ``kill``): each live agent sends
  "failed" at once, with one short request of its own (a signal handler must not wait on the
  sender thread's locks), then the handler that was installed before ours runs: the trainer's
  own, or the default, which ends the process as it would have. An ignored SIGTERM stays
  ignored and marks nothing. If the trainer's handler lets the process go on, the agent sets
  the run running again at its next step.
* An unhandled exception (not in an interactive interpreter, where the next prompt follows):
  the previous ``sys.excepthook`` prints the traceback first, then each live agent closes as
  "failed", delivering what it can within a few seconds.

A kill -9 cannot be caught: the server shows such a run stale, then crashed, from its missing
heartbeats. Hooks are installed once per process, from the main thread only (signal handlers
can be set nowhere else), and chain to whatever was there, so the trainer's handling stays.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import threading
import urllib.parse
import urllib.request
import weakref
from datetime import UTC, datetime
from types import FrameType, TracebackType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from packscope.agent.agent import Agent

log = logging.getLogger("packscope.agent")
SIGNAL_REQUEST_S = 2.0  # the one request a SIGTERM handler makes, at most this long
EXCEPTION_CLOSE_S = 5.0  # what an unhandled exception waits for the records to go out

_agents: weakref.WeakSet[Agent] = weakref.WeakSet()
_installed = False
_previous_sigterm: Any = None
_previous_excepthook: Any = None


def watch(agent: Agent) -> None:
    """Mark `agent`'s run failed on SIGTERM and on an unhandled exception, until it closes."""
    _agents.add(agent)
    _install()


def forget(agent: Agent) -> None:
    _agents.discard(agent)


def _install() -> None:
    global _installed, _previous_sigterm, _previous_excepthook
    if _installed or threading.current_thread() is not threading.main_thread():
        return
    _installed = True
    _previous_excepthook = sys.excepthook
    sys.excepthook = _on_exception
    try:
        _previous_sigterm = signal.signal(signal.SIGTERM, _on_sigterm)
    except (ValueError, OSError) as exc:  # an embedded interpreter without signals
        log.debug("packscope: no SIGTERM handler (%s)", exc)


def _on_sigterm(signum: int, frame: FrameType | None) -> None:
    previous = _previous_sigterm
    if previous == signal.SIG_IGN:
        return  # the process ignores SIGTERM: nothing ends, nothing failed
    for agent in list(_agents):
        agent.terminated()
    if callable(previous):
        previous(signum, frame)
        return
    # The default action (or one set outside Python): end the process as it would have ended.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGTERM)


def _on_exception(kind: type[BaseException], exc: BaseException, tb: TracebackType | None) -> None:
    (_previous_excepthook or sys.__excepthook__)(kind, exc, tb)
    if hasattr(sys, "ps1") or sys.flags.interactive:
        return  # an interactive session carries on after a traceback
    for agent in list(_agents):
        try:
            agent.close("failed", timeout_s=EXCEPTION_CLOSE_S)
        except Exception:  # the process is ending: say so and let it end
            log.exception("packscope: could not mark run %s failed", agent.run_id)


def send_status(server: str, run_id: str, status: str, token: str | None) -> bool:
    """PATCH the run's status with one bounded request of its own (no queue, no lock shared with
    the sender thread): what a signal handler may do."""
    body: dict[str, Any] = {"status": status}
    if status != "running":
        body["ended_at"] = datetime.now(UTC).isoformat()
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    url = f"{server}/api/v1/runs/{urllib.parse.quote(run_id, safe='')}"
    request = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="PATCH")
    try:
        with urllib.request.urlopen(request, timeout=SIGNAL_REQUEST_S):
            return True
    except Exception as exc:  # noqa: BLE001 - a dying process: the missing heartbeats tell the rest
        log.warning("packscope: could not mark run %s %s (%s)", run_id, status, exc)
        return False
