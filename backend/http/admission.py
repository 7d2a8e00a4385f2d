"""Admission: how many requests use the database at once, and how long one may wait for its turn.

Requests wait for a slot in the event loop, where waiting costs no thread and no connection. A
request that does not get one within `wait_s` is answered 503 with Retry-After at once, so a burst
(every rank of a job flushes at the same interval boundary) is shed instead of queued without end.
On SQLite, writes also take one lock per process: the file has a single writer anyway, and waiting
here is fair and cheap where SQLite's busy handler would sleep and poll inside a worker thread.
"""

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Generic, TypeVar

import anyio

T = TypeVar("T")
R = TypeVar("R")


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
        lock = self._write_lock if writes and self.serialise_writes else None
        if self._free_now(lock):
            # The usual case: nothing to wait for, so no timeout scope and no trip through the
            # event loop (anyio's cancel scopes and checkpoints cost more than the work they
            # guard: docs/benchmarks/2026-11-30-2core.md#dev-2026-11-30-1704-ingest-night).
            try:
                yield
            finally:
                self._slots.release()
                if lock is not None:
                    lock.release()
            return
        async with AsyncExitStack() as held:
            with anyio.move_on_after(self.wait_s) as waiting:
                if lock is not None:
                    await held.enter_async_context(lock)
                await held.enter_async_context(self._slots)
            if waiting.cancelled_caught:
                raise self.overloaded()
            yield

    def _free_now(self, lock: anyio.Lock | None) -> bool:
        """Take the lock (when given) and a slot if both are free and nobody waits for them (they
        are taken in the order the waiting path takes them, and never ahead of a waiter)."""
        assert self._slots is not None
        try:
            if lock is not None:
                lock.acquire_nowait()
        except anyio.WouldBlock:
            return False
        try:
            self._slots.acquire_nowait()
        except anyio.WouldBlock:
            if lock is not None:
                lock.release()
            return False
        return True

    def overloaded(self) -> Overloaded:
        return Overloaded(
            f"the server is busy: no database slot came free within {self.wait_s:g} s; "
            f"retry after {self.retry_after_s} s",
            self.retry_after_s,
        )


class _Waiting(Generic[T, R]):
    __slots__ = ("deadline", "item", "result")

    def __init__(self, item: T, result: asyncio.Future[R], deadline: float) -> None:
        self.item = item
        self.result = result
        self.deadline = deadline  # the loop's time at which it is withdrawn if not taken by then


class Coalescer(Generic[T, R]):
    """Work items that arrive while others are being done are done together, in one worker-thread
    call (one transaction) holding one database slot: a burst of small batches (every rank of a job
    flushing at the same boundary) costs one statement per table instead of one per batch.

    An item waits at most `admission.wait_s` to be taken; one still waiting then is withdrawn and
    its request answered 503 with Retry-After (Overloaded), so it certainly was not stored. Once
    taken, it waits for its result however long that takes: its data may already be committed.
    One whose request was cancelled before it was taken is dropped, never stored. The waiting
    items are in the order they came, so one timer, set for the oldest, withdraws them all (not
    one timer per request: a request of one record costs little else here).
    `work` answers one result per item, in order; when it raises, each item of the group is done
    again alone, so one item's failure is its own answer and not its neighbours'.
    """

    def __init__(
        self, admission: Admission, work: Callable[[list[T]], list[R]], weigh: Callable[[T], int], max_weight: int
    ) -> None:
        self.admission = admission
        self.work = work
        self.weigh = weigh
        self.max_weight = max_weight
        self._pending: deque[_Waiting[T, R]] = deque()
        self._writer: asyncio.Task[None] | None = None
        self._expiry: asyncio.TimerHandle | None = None  # withdraws the oldest waiting item in time

    async def submit(self, item: T) -> R:
        loop = asyncio.get_running_loop()
        waiting = _Waiting[T, R](item, loop.create_future(), loop.time() + self.admission.wait_s)
        self._pending.append(waiting)
        # A writer left unfinished by a loop that was closed (a test client's) is not waited for.
        other_loop = self._writer is not None and self._writer.get_loop() is not loop
        if self._writer is None or self._writer.done() or other_loop:
            self._writer = loop.create_task(self._drain())
        if other_loop:
            self._expiry = None  # any timer left belongs to that loop
        # A timer still set in this loop (the writer may have finished since) is kept: it fires at
        # an earlier deadline and sets itself again for the oldest item then waiting, so a second
        # one would only double every firing.
        if self._expiry is None:
            # A timer, not a cancel scope around the wait (anyio's cost is measured in
            # docs/benchmarks/2026-11-30-2core.md#dev-2026-11-30-1704-ingest-night).
            self._expiry = loop.call_at(waiting.deadline, self._withdraw_expired)
        # Awaited as it is: a cancelled request cancels its future, and an item whose future is
        # done is never taken (_take), so the group's answers go to those still waiting.
        return await waiting.result

    def _withdraw_expired(self) -> None:
        """Items not taken by their deadline are withdrawn and answered 503; the timer is set
        again for the oldest one left."""
        self._expiry = None
        pending = self._pending
        if not pending:
            return
        loop = pending[0].result.get_loop()
        now = loop.time()
        while pending and pending[0].deadline <= now:
            waiting = pending.popleft()
            if not waiting.result.done():
                waiting.result.set_exception(self.admission.overloaded())
        if pending:
            self._expiry = loop.call_at(pending[0].deadline, self._withdraw_expired)

    def _take(self) -> list[_Waiting[T, R]]:
        """The oldest waiting items up to max_weight (at least one), past those whose request
        was cancelled; empty when none is left."""
        pending, weight = self._pending, 0
        group: list[_Waiting[T, R]] = []
        while pending:
            waiting = pending[0]
            if waiting.result.done():  # cancelled: dropped, not stored
                pending.popleft()
                continue
            if group and weight + self.weigh(waiting.item) > self.max_weight:
                break
            group.append(pending.popleft())
            weight += self.weigh(waiting.item)
        return group

    async def _drain(self) -> None:
        while self._pending:
            try:
                async with self.admission.turn(writes=True):
                    group = self._take()
                    if not group:  # every item withdrew (or was cancelled) while the slot was awaited
                        return
                    await self._do(group)
            except Overloaded:
                continue  # no slot within wait_s: the items still waiting withdraw on their own

    async def _do(self, group: list[_Waiting[T, R]]) -> None:
        try:
            results = await anyio.to_thread.run_sync(self.work, [w.item for w in group])
        except Exception as exc:  # noqa: BLE001 - handed to the requests, whose handlers answer it
            if len(group) == 1:
                if not group[0].result.done():  # its request may have been cancelled meanwhile
                    group[0].result.set_exception(exc)
                return
            for waiting in group:
                await self._do([waiting])
            return
        except BaseException:  # cancelled (the server stops): nobody may wait for ever
            for waiting in group:
                if not waiting.result.done():
                    waiting.result.set_exception(RuntimeError("the server stopped while storing this batch"))
            raise
        for waiting, result in zip(group, results, strict=True):
            if not waiting.result.done():
                waiting.result.set_result(result)
