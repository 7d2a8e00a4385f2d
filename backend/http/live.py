"""Live push: a run's new intervals wake its open streams (SSE) at once, in every server process.

A run's id is published once its batch is committed; each process's LiveHub wakes the streams
of that run, which then read the run's state (one small query) and send an event. Between
processes the wake-up travels by what the database offers:

* PostgreSQL: NOTIFY on one channel, LISTENed to by one connection per process (servers on
  several machines share it; the payload is the run id). A batch's own statement NOTIFYs, and
  PostgreSQL sends it at commit (store/writes.py).
* SQLite, whose servers share one machine (WAL needs it): unix datagram sockets, one per process,
  in a folder beside the database. A publisher sends the run id to every socket there; a socket
  whose process died refuses it and is removed. Chosen over a watched file (inotify is not in the
  standard library, and a file's change says nothing of which run), a FIFO (one reader each, and
  opening one blocks until a reader comes) and UDP multicast (needs a multicast route on the
  loopback interface): datagrams are stdlib, need no poll, carry the run id and cannot be read
  by another user (the folder is 0700).

Where neither works (no unix sockets), streams fall back to polling every PACKSCOPE_STREAM_POLL_S.
Every stream also re-reads its run's state with each keep-alive, so a lost wake-up costs at most
one keep-alive interval.

An event carries the chart series of the intervals it announces (routes/reads.py), made once per
process however many streams send it (EventTexts).
"""

import asyncio
import concurrent.futures
import hashlib
import logging
import os
import secrets
import socket
import tempfile
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, Protocol

from sqlalchemy import Engine

from packscope.backend.store.writes import NOTIFY_CHANNEL

log = logging.getLogger("packscope.backend")

MAX_UNIX_PATH = 100  # sockaddr_un holds 108 bytes on Linux, 104 on macOS
MAX_RUN_ID_BYTES = 256  # run ids are at most 64 characters; a datagram larger than this is not ours


class Transport(Protocol):
    """Carries published run ids to every process's hub (this one's included)."""

    pushes: bool  # False: other processes are not told, streams must poll
    # True: a batch's own transaction tells every process (store/writes.py), so ingest need not
    # publish it
    told_by_ingest: bool

    async def start(self, hub: "LiveHub") -> None: ...
    def publish(self, run_id: str) -> None: ...
    def streams_open(self, any_open: bool) -> None: ...  # whether this process has a stream to wake
    async def stop(self) -> None: ...


class LiveHub:
    """The open streams of this process, by run id, and the transport that wakes them.

    The transport lives in the event loop that started the hub; streams and publishers may live
    in another (a test's second client), so wake-ups cross loops thread-safely.
    """

    def __init__(self, transport: Transport) -> None:
        self.transport = transport
        self._waiting: dict[str, set[tuple[asyncio.Event, asyncio.AbstractEventLoop]]] = {}
        self._starts = 0
        self.loop: asyncio.AbstractEventLoop | None = None
        self.texts = EventTexts()  # what the streams send, made once per event (routes/reads.py)

    @property
    def pushes(self) -> bool:
        return self.transport.pushes

    async def start(self) -> None:
        """Start the transport (once: the app's lifespan may be entered again, as by schemathesis)."""
        self._starts += 1
        if self._starts == 1:
            self.loop = asyncio.get_running_loop()
            await self.transport.start(self)

    async def stop(self) -> None:
        self._starts -= 1
        if self._starts == 0:
            await self.transport.stop()
            self.texts.close()

    def publish(self, run_id: str) -> None:
        """After a commit that changed `run_id`'s intervals (or removed the run); from any thread."""
        self._in_loop(self.transport.publish, run_id)

    def stored(self, run_id: str) -> None:
        """After a commit that stored new intervals of `run_id`: published, unless the batch's own
        transaction told every process already (PostgreSQL)."""
        if not self.transport.told_by_ingest:
            self.publish(run_id)

    def _in_loop(self, call: Callable[[Any], None], argument: Any) -> None:
        """`call(argument)` in the transport's event loop, from any thread."""
        if self.loop is None or self.loop.is_closed():
            return  # not serving (an app used without its lifespan): nobody listens
        if _running_loop() is self.loop:
            call(argument)
        else:
            self.loop.call_soon_threadsafe(call, argument)

    @contextmanager
    def subscribe(self, run_id: str) -> Iterator[asyncio.Event]:
        """An event set whenever `run_id` is published, for as long as the block runs."""
        entry = (asyncio.Event(), asyncio.get_running_loop())
        first = not self._waiting
        self._waiting.setdefault(run_id, set()).add(entry)
        if first:
            self._in_loop(self.transport.streams_open, True)
        try:
            yield entry[0]
        finally:
            waiting = self._waiting.get(run_id)
            if waiting is not None:
                waiting.discard(entry)
                if not waiting:
                    del self._waiting[run_id]
            if not self._waiting:
                self._in_loop(self.transport.streams_open, False)

    def has_streams(self) -> bool:
        return bool(self._waiting)

    def wake(self, run_id: str) -> None:
        for entry in list(self._waiting.get(run_id, ())):
            _set(*entry)

    def wake_all(self) -> None:
        """After a wake-up may have been missed (a lost connection): every stream re-reads."""
        for waiting in list(self._waiting.values()):
            for entry in list(waiting):
                _set(*entry)


class EventTexts:
    """What streams send for a change of a run's state, made once in this process however many
    streams send it (a run page open in a thousand browsers is a thousand streams woken together):
    the first stream to ask makes it in a worker thread, the others await that same answer. Kept
    by a key that names everything the text depends on; the last `keep` kept.

    The making does not belong to the stream that started it: a stream whose client leaves meanwhile
    stops waiting, the others still get the text. Streams may live in different event loops (a
    test's second client), hence concurrent futures rather than asyncio's."""

    def __init__(self, keep: int = 256, threads: int = 2) -> None:
        self._keep = keep
        self._threads = threads
        self._made: OrderedDict[Hashable, concurrent.futures.Future[str]] = OrderedDict()
        self._lock = threading.Lock()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None

    async def text(self, key: Hashable, make: Callable[[], str]) -> str:
        """`make()`'s text, made once per key; raises what making it raised."""
        with self._lock:
            future = self._made.get(key)
            if future is None:
                if self._pool is None:
                    self._pool = concurrent.futures.ThreadPoolExecutor(self._threads, thread_name_prefix="live-event")
                future = self._made[key] = self._pool.submit(make)
                future.add_done_callback(lambda done: self._forget_failed(key, done))
                while len(self._made) > self._keep:
                    self._made.popitem(last=False)
        # shield: a stream cancelled while waiting must not cancel the making the others await.
        return await asyncio.shield(asyncio.wrap_future(future))

    def _forget_failed(self, key: Hashable, done: concurrent.futures.Future[str]) -> None:
        """A failure is not kept: the next stream to ask tries again."""
        if done.cancelled() or done.exception() is not None:
            with self._lock:
                if self._made.get(key) is done:
                    del self._made[key]

    def close(self) -> None:
        with self._lock:
            pool, self._pool = self._pool, None
            self._made.clear()
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _set(woken: asyncio.Event, loop: asyncio.AbstractEventLoop) -> None:
    if _running_loop() is loop:
        woken.set()
    elif not loop.is_closed():
        loop.call_soon_threadsafe(woken.set)


class InProcess:
    """This process's streams only; other processes' streams poll."""

    pushes = False
    told_by_ingest = False

    async def start(self, hub: LiveHub) -> None:
        self.hub = hub

    def publish(self, run_id: str) -> None:
        self.hub.wake(run_id)

    def streams_open(self, any_open: bool) -> None:
        return None

    async def stop(self) -> None:
        return None


class _Coalesced:
    """Run ids published within one turn of the event loop are sent together."""

    def __init__(self) -> None:
        self._pending: set[str] = set()
        self._scheduled = False

    def _add(self, run_id: str) -> bool:
        """Whether the caller must schedule a flush."""
        self._pending.add(run_id)
        if self._scheduled:
            return False
        self._scheduled = True
        return True

    def _take(self) -> list[str]:
        taken, self._pending, self._scheduled = sorted(self._pending), set(), False
        return taken


class UnixDatagrams(_Coalesced):
    """One datagram socket per process in `folder`; a published run id goes to each of them."""

    pushes = True
    told_by_ingest = False

    def __init__(self, folder: Path) -> None:
        super().__init__()
        self.folder = folder
        self._own: Path | None = None
        self._receiver: socket.socket | None = None
        self._sender: socket.socket | None = None
        self._peers: list[Path] = []  # the other processes' sockets, as last listed
        self._listed: tuple[int, float] | None = None  # (the folder's mtime then, monotonic time)

    async def start(self, hub: LiveHub) -> None:
        self.hub = hub
        self.loop = asyncio.get_running_loop()
        try:
            self._bind()
        except OSError as exc:  # a folder of another user, a read-only filesystem: poll instead
            log.warning(
                "live push: cannot use %s (%s); live pages poll every PACKSCOPE_STREAM_POLL_S", self.folder, exc
            )
            self.pushes = False
            self._own = None
            return
        assert self._receiver is not None
        self.loop.add_reader(self._receiver.fileno(), self._receive)

    def _bind(self) -> None:
        self._own = self.folder / f"{os.getpid()}-{secrets.token_hex(4)}.sock"
        receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        for attempt in range(3):
            self.folder.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                receiver.bind(str(self._own))
                break
            except FileNotFoundError:  # the last other process removed the folder in between
                if attempt == 2:
                    receiver.close()
                    raise
        receiver.setblocking(False)
        self._receiver = receiver
        self._sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sender.setblocking(False)

    def _receive(self) -> None:
        assert self._receiver is not None
        while True:
            try:
                data = self._receiver.recv(MAX_RUN_ID_BYTES)
            except (BlockingIOError, InterruptedError):
                return
            self.hub.wake(data.decode("utf-8", "replace"))

    def publish(self, run_id: str) -> None:
        if self._add(run_id):
            self.loop.call_soon(self._flush)

    def streams_open(self, any_open: bool) -> None:
        return None  # a datagram comes only when another process publishes: nothing to save

    def _flush(self) -> None:
        run_ids = self._take()
        for run_id in run_ids:
            self.hub.wake(run_id)  # this process's streams, without a trip through the socket
        if self._sender is None:  # not bound: other processes poll
            return
        try:
            peers = self._current_peers()
        except FileNotFoundError:  # the folder was removed: recreated by the next process to start
            return
        for peer in peers:
            for run_id in run_ids:
                try:
                    self._sender.sendto(run_id.encode(), str(peer))
                except ConnectionRefusedError:  # its process died without removing it
                    with suppress(OSError):
                        peer.unlink()
                    self._listed = None
                    break
                except FileNotFoundError:  # it stopped in between
                    break
                except (BlockingIOError, InterruptedError):  # its queue is full: it is awake anyway
                    break

    # The folder is listed again when its mtime changes (a socket made or removed) or a second
    # has passed (a filesystem whose mtime is coarse): a listing per flush cost server CPU on
    # every ingested row (docs/benchmarks/2026-12-01-2core.md#dev-2026-12-01-evening).
    _RELIST_S = 1.0

    def _current_peers(self) -> list[Path]:
        mtime, now = os.stat(self.folder).st_mtime_ns, time.monotonic()
        if self._listed is None or self._listed[0] != mtime or now - self._listed[1] > self._RELIST_S:
            self._peers = [p for p in self.folder.iterdir() if p.suffix == ".sock" and p != self._own]
            self._listed = (mtime, now)
        return self._peers

    async def stop(self) -> None:
        if self._receiver is not None:
            self.loop.remove_reader(self._receiver.fileno())
            self._receiver.close()
        if self._sender is not None:
            self._sender.close()
        if self._own is not None:
            with suppress(OSError):
                self._own.unlink()
            # The last process out removes the folder (only an empty one can go), so that stopped
            # servers leave nothing behind in the temporary folder.
            with suppress(OSError):
                self.folder.rmdir()


class PostgresNotify(_Coalesced):
    """NOTIFY packscope_intervals '<run id>' at a commit; every process LISTENs on its own
    connection (psycopg's notifies) while it has a stream open, and reconnects, waking every
    stream, when the connection is lost. A batch of intervals NOTIFYs in its own transaction
    (store/writes.py); `publish` NOTIFYs the rest (a deleted run) on a connection of its own.

    Only while a stream is open: every batch of every server is a notification to every
    listening process, whose receipt costs it CPU (docs/benchmarks/2026-12-03-2core.md#dev-2026-12-03) whether or
    not anyone watches. A stream that opens wakes once LISTEN is in place, so a batch committed
    before then is read, not missed."""

    pushes = True
    told_by_ingest = True
    _RECHECK_S = 1.0  # how often a listening connection looks whether streams are still open

    def __init__(self, conninfo: str) -> None:
        super().__init__()
        self.conninfo = conninfo
        self._listener: asyncio.Task[None] | None = None
        self._publisher: object | None = None  # psycopg.AsyncConnection, opened on first use
        self._wanted: asyncio.Event | None = None  # set while this process has a stream open

    async def start(self, hub: LiveHub) -> None:
        self.hub = hub
        self.loop = asyncio.get_running_loop()
        self._wanted = asyncio.Event()
        if hub.has_streams():
            self._wanted.set()
        ready = self.loop.create_future()
        self._listener = self.loop.create_task(self._listen(ready))
        # Serving starts once the connection is made (or failed once, then retried in the background).
        await asyncio.wait_for(asyncio.shield(ready), timeout=10)

    def streams_open(self, any_open: bool) -> None:
        if self._wanted is not None:
            if any_open:
                self._wanted.set()
            else:
                self._wanted.clear()

    async def _listen(self, ready: asyncio.Future[None]) -> None:
        import psycopg

        assert self._wanted is not None
        backoff_s = 0.5
        while True:
            try:
                async with await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True) as connection:
                    if not ready.done():
                        ready.set_result(None)
                    backoff_s = 0.5
                    while True:
                        await self._wanted.wait()
                        await connection.execute(f"LISTEN {NOTIFY_CHANNEL}")
                        self.hub.wake_all()  # whatever was published while this was not listening
                        while self._wanted.is_set():
                            async for notice in connection.notifies(timeout=self._RECHECK_S):
                                self.hub.wake(notice.payload)
                        await connection.execute(f"UNLISTEN {NOTIFY_CHANNEL}")
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - the database restarts or is away: retry
                log.warning("live push: lost the PostgreSQL LISTEN connection (%s); retrying in %.1f s", exc, backoff_s)
                if not ready.done():
                    ready.set_result(None)
                await asyncio.sleep(backoff_s)
                backoff_s = min(backoff_s * 2, 10.0)

    def publish(self, run_id: str) -> None:
        if self._add(run_id):
            self.loop.create_task(self._flush())

    async def _flush(self) -> None:
        import psycopg

        while run_ids := self._take():
            try:
                if self._publisher is None:
                    self._publisher = await psycopg.AsyncConnection.connect(self.conninfo, autocommit=True)
                connection: psycopg.AsyncConnection = self._publisher  # type: ignore[assignment]
                await connection.execute(
                    "SELECT pg_notify(%s, run_id) FROM unnest(%s::text[]) AS run_id", (NOTIFY_CHANNEL, run_ids)
                )
            except Exception as exc:  # noqa: BLE001 - this process's streams are still told
                log.warning("live push: NOTIFY failed (%s); other servers learn of it at their next keep-alive", exc)
                await self._close_publisher()
                for run_id in run_ids:
                    self.hub.wake(run_id)

    async def _close_publisher(self) -> None:
        publisher, self._publisher = self._publisher, None
        if publisher is not None:
            with suppress(Exception):
                await publisher.close()  # type: ignore[attr-defined]

    async def stop(self) -> None:
        if self._listener is not None:
            self._listener.cancel()
            with suppress(asyncio.CancelledError, Exception):
                await self._listener
        await self._close_publisher()


def _socket_folder(database: str) -> Path:
    """Beside the database, unless that path is too long for a socket address: then in the
    temporary folder, named after the database's absolute path."""
    beside = Path(f"{database}.live")
    if len(str(beside.resolve())) + 24 <= MAX_UNIX_PATH:
        return beside
    digest = hashlib.sha256(str(Path(database).resolve()).encode()).hexdigest()[:16]
    return Path(tempfile.gettempdir()) / f"packscope-live-{digest}"


def transport_for(engine: Engine) -> Transport:
    if engine.dialect.name == "postgresql":
        url = engine.url.set(drivername="postgresql")
        return PostgresNotify(url.render_as_string(hide_password=False))
    if not hasattr(socket, "AF_UNIX") or engine.url.database is None:
        return InProcess()
    return UnixDatagrams(_socket_folder(engine.url.database))
