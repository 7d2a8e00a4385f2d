"""How the server runs under uvicorn: its options from the settings, an HTTP protocol that times
out slow request heads and bodies, and worker processes that die with the process that started them.

uvicorn times out idle kept-alive connections (timeout_keep_alive) but not a client that sends
its request head or body a byte at a time (slowloris): each byte resets nothing and the
connection is held for ever. GuardedHttpToolsProtocol gives each head, and then each body, a
deadline of its own that arriving bytes do not extend.
"""

import ctypes
import ctypes.util
import functools
import inspect
import os
import signal
import sys
import threading
import time
from asyncio import TimerHandle, Transport
from typing import Any

import uvicorn
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from packscope.backend.http.settings import Settings

SUPERVISOR_PID = "PACKSCOPE_SUPERVISOR_PID"  # set by `packscope serve` for its worker processes
MAX_HEAD_BYTES = 64 * 1024  # a request line and headers; beyond it the client is answered 431
TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
WORKER_HEALTHCHECK_S = 120  # a worker's startup or health check; uvicorn's default is too short under load
HEAD_TOO_LARGE = b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


class GuardedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol with a deadline for each request head (from the connection's
    start, or from the previous answer on a kept-alive connection) and for each body (from the
    end of its head), and a cap on a head's size. A client past a deadline is answered 408 (when
    nothing was answered yet) and disconnected; an application still reading the body sees the
    client leave."""

    # None: from the PACKSCOPE_* environment (worker processes, which `packscope serve` starts by
    # name); protocol_for sets them for a server run in this process.
    head_timeout_s: float | None = None
    body_timeout_s: float | None = None

    def connection_made(self, transport: Transport) -> None:  # type: ignore[override]
        # The deadline (the loop's time) and one timer that fires at or before it: a request
        # moves the deadline on without a new timer (most connections of a large job send a
        # request a second, each would otherwise set and cancel two timers); one that finds the
        # deadline moved on is set again for it.
        self._deadline_at: float | None = None
        self._deadline: TimerHandle | None = None
        self._armed_at = 0.0
        if self.head_timeout_s is None or self.body_timeout_s is None:
            settings = _environment_settings()
            type(self).head_timeout_s = settings.request_head_timeout_s
            type(self).body_timeout_s = settings.request_body_timeout_s
        super().connection_made(transport)
        self._await_head()

    def _await_head(self) -> None:
        self._head_bytes = 0
        self._in_head = True
        self._set_deadline(self.head_timeout_s)

    def _set_deadline(self, seconds: float | None) -> None:
        if seconds is None:
            self._deadline_at = None  # a timer still set finds nothing due
            return
        at = self._deadline_at = self.loop.time() + seconds
        if self._deadline is None or self._armed_at > at:
            self._arm(at)

    def _arm(self, at: float) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline, self._armed_at = self.loop.call_at(at, self._deadline_due), at

    def _deadline_due(self) -> None:
        self._deadline = None
        at = self._deadline_at
        if at is None:
            return
        if self.loop.time() < at:  # moved on since the timer was set
            self._arm(at)
            return
        self._deadline_at = None
        self._too_slow()

    def _too_slow(self) -> None:
        if self.transport.is_closing():
            return
        if self.cycle is None or self.cycle.response_complete or not self.cycle.response_started:
            self.transport.write(TIMED_OUT)
        self.transport.close()

    def data_received(self, data: bytes) -> None:
        if self._in_head:
            self._head_bytes += len(data)  # with any body bytes in the same piece: judged below
        super().data_received(data)
        # Still no end of the head after this many bytes (a piece that ends the head passes).
        if self._in_head and self._head_bytes > MAX_HEAD_BYTES and not self.transport.is_closing():
            self._set_deadline(None)
            self.transport.write(HEAD_TOO_LARGE)
            self.transport.close()

    def on_headers_complete(self) -> None:
        self._in_head = False
        super().on_headers_complete()
        # A GET's message is complete at once (on_message_complete follows); a body gets its own time.
        self._set_deadline(self.body_timeout_s)

    def on_message_complete(self) -> None:
        self._set_deadline(None)
        super().on_message_complete()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        # Unless a pipelined request already started: the next head is awaited from now on.
        if not self.transport.is_closing() and (self.cycle is None or self.cycle.response_complete):
            self._await_head()

    def connection_lost(self, exc: Exception | None) -> None:
        self._deadline_at = None
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        super().connection_lost(exc)


@functools.cache
def _environment_settings() -> Settings:
    return Settings()


def protocol_for(settings: Settings) -> type[GuardedHttpToolsProtocol]:
    """GuardedHttpToolsProtocol with the deadlines of `settings`, for a server in this process
    (uvicorn builds one per connection; a class made here cannot be sent to worker processes)."""
    return type(
        "GuardedHttpToolsProtocol",
        (GuardedHttpToolsProtocol,),
        {"head_timeout_s": settings.request_head_timeout_s, "body_timeout_s": settings.request_body_timeout_s},
    )


def uvicorn_options(settings: Settings, *, workers: int = 1) -> dict[str, Any]:
    """uvicorn.run / uvicorn.Config options that `packscope serve` (and the tests' servers) use;
    worker processes read the deadlines from the environment, as they read every setting."""
    trusted = settings.trusted_proxy_list
    supervised = {}
    if workers > 1 and "timeout_worker_healthcheck" in inspect.signature(uvicorn.Config).parameters:
        # uvicorn kills a worker that has not answered its health check in this many seconds, its
        # startup included (a few by default): on a loaded machine the app's imports alone take longer,
        # and every worker was killed and started again, for ever, the server never answering.
        supervised["timeout_worker_healthcheck"] = WORKER_HEALTHCHECK_S
    return {
        **supervised,
        "http": GuardedHttpToolsProtocol if workers > 1 else protocol_for(settings),
        "timeout_keep_alive": settings.keep_alive_s,
        # uvicorn believes X-Forwarded-For from 127.0.0.1 unless told otherwise, so that any local
        # process could pass for any address (and escape the per-client limits): only named proxies.
        "proxy_headers": bool(trusted),
        "forwarded_allow_ips": trusted or [],
        # Live streams never end on their own; without a limit, Ctrl-C would wait for every open page.
        "timeout_graceful_shutdown": 3,
    }


# -- worker processes -------------------------------------------------------------------------------
PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """Have this process stopped (SIGTERM: a graceful shutdown that frees the port) when its
    parent, `packscope serve`, dies, even by SIGKILL: otherwise its workers go on serving as
    orphans and a restart finds the port taken. Linux's PR_SET_PDEATHSIG; elsewhere a thread
    that watches the parent."""
    libc_name = ctypes.util.find_library("c") if sys.platform.startswith("linux") else None
    if libc_name is not None:
        libc = ctypes.CDLL(libc_name, use_errno=True)
        if libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0) == 0:
            if os.getppid() != parent_pid:  # the parent died before the request took effect
                os.kill(os.getpid(), signal.SIGTERM)
            return

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(1.0)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="packscope-parent-watch", daemon=True).start()


def worker_app() -> Any:
    """The app of one `packscope serve` worker process (uvicorn's factory)."""
    from packscope.backend.server.app import create_app

    parent = os.environ.get(SUPERVISOR_PID)
    if parent:
        die_with_parent(int(parent))
    return create_app()
