"""CSV exports that no reader can use to stop the server.

A run's CSV is written by the database as fast as it can into an unnamed temporary file (in
TMPDIR), holding one database slot (admission) and one connection only while it does; the answer
is streamed from that file at the reader's pace. A client that requests a CSV and does not read
it holds a file, never a database connection: before this, 40 such clients held every pooled
connection and the runs list and ingest answered 503.

Exports streaming at once are capped per client address (429 beyond) and in all (503 beyond),
per worker process, which also bounds the temporary disk they use.
"""

import asyncio
import os
import tempfile
import threading
from collections.abc import AsyncIterator, Callable
from typing import Any

import anyio
from fastapi import HTTPException, status
from sqlalchemy.orm import Session, sessionmaker

from packscope.backend.http.admission import Admission
from packscope.backend.reads import csv_export
from packscope.backend.store.runs import get_run

READ_BYTES = 256 * 1024  # sent to the client at a time


class CsvLimits:
    """How many exports stream at once, per client and in all."""

    def __init__(self, total: int, per_client: int, retry_after_s: int) -> None:
        self.total = total
        self.per_client = per_client
        self.retry_after_s = retry_after_s
        self.streaming: dict[str, int] = {}
        self._writers: anyio.CapacityLimiter | None = None

    @property
    def writers(self) -> anyio.CapacityLimiter:
        """The threads that write CSV files (not the request pool's); made in the event loop."""
        if self._writers is None:
            self._writers = anyio.CapacityLimiter(self.total)
        return self._writers

    def claim(self, client: str) -> Callable[[], None]:
        """Count an export of `client`, or refuse it; the returned function ends it (once)."""
        retry = {"Retry-After": str(self.retry_after_s)}
        if self.streaming.get(client, 0) >= self.per_client:
            raise HTTPException(
                status.HTTP_429_TOO_MANY_REQUESTS,
                detail=f"{self.per_client} CSV exports of {client} are still streaming; finish or close one "
                "(PACKSCOPE_CSV_STREAMS_PER_CLIENT)",
                headers=retry,
            )
        if sum(self.streaming.values()) >= self.total:
            raise HTTPException(
                status.HTTP_503_SERVICE_UNAVAILABLE,
                detail=f"the server is busy: {self.total} CSV exports are streaming (PACKSCOPE_CSV_STREAMS); "
                f"retry after {self.retry_after_s} s",
                headers=retry,
            )
        self.streaming[client] = self.streaming.get(client, 0) + 1
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self.streaming[client] -= 1
                if not self.streaming[client]:
                    del self.streaming[client]

        return release


class SpooledCsv:
    """One export: the database writes the file in a worker thread, the answer reads it behind."""

    def __init__(self) -> None:
        self.file = tempfile.TemporaryFile()  # noqa: SIM115 - closed when both writer and reader are done
        self.written = 0
        self.finished = False
        self.failed: BaseException | None = None
        self.abandoned = threading.Event()  # the client left: the writer stops at its next piece
        self.more = asyncio.Event()
        self.loop = asyncio.get_running_loop()

    def write_all(self, make_session: sessionmaker[Session], run_id: str, found: Callable[[bool], None]) -> None:
        """In a worker thread: the run's CSV into the file (found(False) when it is not stored)."""
        try:
            with make_session() as session:
                run = get_run(session, run_id)
                found(run is not None)
                if run is None:
                    return
                for piece in csv_export.csv_bytes(session, run):
                    if self.abandoned.is_set():
                        return
                    self.file.write(piece)
                    self.file.flush()
                    self.written = self.file.tell()
                    self.loop.call_soon_threadsafe(self.more.set)
        except BaseException as exc:
            self.failed = exc
            raise
        finally:
            self.finished = True
            self.loop.call_soon_threadsafe(self.more.set)

    async def chunks(self, writer: "asyncio.Task[Any]", on_close: Callable[[], None]) -> AsyncIterator[bytes]:
        sent = 0
        try:
            while True:
                self.more.clear()  # before looking: a piece written meanwhile sets it again
                if sent < self.written:
                    data = os.pread(self.file.fileno(), min(READ_BYTES, self.written - sent), sent)
                    sent += len(data)
                    yield data
                elif self.finished:
                    if self.failed is not None:  # the answer has begun: a cut-off stream is the signal
                        raise RuntimeError("the CSV export failed while streaming") from self.failed
                    return
                else:
                    await self.more.wait()
        finally:
            self.abandoned.set()
            on_close()
            # The file is closed once the writer has stopped (at once when it is done).
            writer.add_done_callback(lambda _task: self.file.close())


async def start_export(
    admission: Admission, make_session: sessionmaker[Session], run_id: str, writers: anyio.CapacityLimiter
) -> tuple[SpooledCsv, "asyncio.Task[Any]"] | None:
    """Begin writing `run_id`'s CSV; None when the run is not stored. Raises Overloaded (503)
    when no database slot comes free in time."""
    spool = SpooledCsv()
    loop = spool.loop
    ready: asyncio.Future[bool] = loop.create_future()

    def found(stored: bool) -> None:
        def settle() -> None:
            if not ready.done():
                ready.set_result(stored)

        loop.call_soon_threadsafe(settle)

    async def write() -> None:
        try:
            async with admission.turn(writes=False):
                await anyio.to_thread.run_sync(spool.write_all, make_session, run_id, found, limiter=writers)
        except BaseException as exc:
            if not ready.done():
                ready.set_exception(exc)
            if not isinstance(exc, Exception):
                raise

    writer = loop.create_task(write())
    try:
        stored = await ready
    except BaseException:
        spool.file.close()
        raise
    if not stored:
        spool.file.close()
        return None
    return spool, writer
