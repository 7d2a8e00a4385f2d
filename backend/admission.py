"""Admission: how many requests use the database at once, and how long one may wait for its turn.

Requests wait for a slot in the event loop, where waiting costs no thread and no connection. A
request that does not get one within `wait_s` is answered 503 with Retry-After at once, so a burst
(every rank of a job flushes at the same interval boundary) is shed instead of queued without end.
On SQLite, writes also take one lock per process: the file has a single writer anyway, and waiting
here is fair and cheap where SQLite's busy handler would sleep and poll inside a worker thread.
"""

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager

import anyio


class Overloaded(Exception):
    """No slot came free in time: the client should retry after `retry_after_s`."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class Admission:
    def __init__(self, slots: int, wait_s: float, retry_after_s: int, serialise_writes: bool) -> None:
        self.slots = slots
        self.wait_s = wait_s
        self.retry_after_s = retry_after_s
        self.serialise_writes = serialise_writes
        # anyio primitives belong to the event loop that first uses them: created on first use.
        self._slots: anyio.Semaphore | None = None
        self._write_lock: anyio.Lock | None = None
        self._closing: anyio.CapacityLimiter | None = None

    async def run_closing(self, close: Callable[[], object]) -> None:
        """Run `close` (a session's close, which returns its connection) in a thread of its own pool.

        Never in the request thread pool: were its threads all waiting for pooled connections,
        the connections they wait for could not be handed back (the deadlock this module prevents).
        """
        if self._closing is None:
            self._closing = anyio.CapacityLimiter(self.slots)
        await anyio.to_thread.run_sync(close, limiter=self._closing)

    @asynccontextmanager
    async def turn(self, writes: bool) -> AsyncIterator[None]:
        """Hold a database slot (and on SQLite the write lock, for writes) for the block."""
        if self._slots is None or self._write_lock is None:
            self._slots, self._write_lock = anyio.Semaphore(self.slots), anyio.Lock()
        async with AsyncExitStack() as held:
            with anyio.move_on_after(self.wait_s) as waiting:
                if writes and self.serialise_writes:
                    await held.enter_async_context(self._write_lock)
                await held.enter_async_context(self._slots)
            if waiting.cancelled_caught:
                raise Overloaded(
                    f"the server is busy: no database slot came free within {self.wait_s:g} s; "
                    f"retry after {self.retry_after_s} s",
                    self.retry_after_s,
                )
            yield
