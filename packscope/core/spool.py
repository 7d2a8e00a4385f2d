"""The sender's on-disk spool: one SQLite file (WAL mode) per run, holding undelivered records.

Written by the agent's sender thread (packscope.agent.sender), read by `packscope sync`, which
sends what a run left behind; so it lives in the torch-free core and needs the standard library
only. Besides the records it keeps, in its `meta` table, the run's registration body (`run`) and,
when it could not be delivered, the run's final status (`final`): all a later process needs to
send the run without the trainer.

Every record the trainer hands over is committed here before it is sent, and deleted once the
server has taken it (write-ahead). A kill -9 at any point therefore loses nothing that was
committed and never stores a record twice; at worst a record is sent again after a crash
between the server's answer and its deletion, which the server's (run, rank, interval) key
turns into a counted duplicate. A spool left by an earlier process with the same run_id is
simply the same file, so it is replayed first.

Costs do not grow with the spool's size: records are rows keyed by an increasing INTEGER
PRIMARY KEY, so appending, reading the oldest and deleting them (after delivery, or to evict)
touch O(log n) pages, and the record and byte totals live in a one-row table updated in the same
transactions, so opening the file and evicting never scan it. Bodies are stored as the compact
JSON sent on the wire: a replay joins them without parsing, and
``sqlite3 <path> "select json_extract(body, '$.interval') from records"`` shows what waits.

Records the server will not take are moved, in one transaction, to the ``set_aside`` table with
the reason, so they never block the rest and are never lost silently. They are tried again later
(`due_set_aside`), each try at twice the wait of the one before, a bounded number of times and
for a bounded age: a record refused by a server that was broken, or too old for it, is delivered
once the server would take it; one the server will never take stays in the table, with the reason.
"""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any, NamedTuple

log = logging.getLogger("packscope.agent")

DEFAULT_SPOOL_DIR = "~/.cache/packscope/spool"  # the agent's, and what `packscope sync` sends by default
# PRAGMA user_version of a spool file this module writes; 2 added set_aside's retry columns.
FORMAT_VERSION = 2
# Set-aside records are tried again: first SET_ASIDE_RETRY_S after being set aside, then at twice
# the wait each time, until they have failed SET_ASIDE_MAX_ATTEMPTS times in all or were set aside
# SET_ASIDE_MAX_AGE_S ago (10 min, 20, 40, 80: five tries over 2.5 hours, for at most a week).
SET_ASIDE_RETRY_S = 600.0
SET_ASIDE_MAX_ATTEMPTS = 5
SET_ASIDE_MAX_AGE_S = 7 * 24 * 3600.0
_SCHEMA = """
CREATE TABLE IF NOT EXISTS records (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- delivery order; never reused, even once empty
    body TEXT NOT NULL,                    -- the record's compact JSON, exactly as sent
    size INTEGER NOT NULL                  -- len(body): bytes, as the JSON is ASCII
);
CREATE TABLE IF NOT EXISTS totals (
    one INTEGER PRIMARY KEY CHECK (one = 1),
    records INTEGER NOT NULL,
    bytes INTEGER NOT NULL
);
INSERT OR IGNORE INTO totals VALUES (1, 0, 0);
CREATE TABLE IF NOT EXISTS set_aside (
    id INTEGER PRIMARY KEY,  -- the record's id in `records`
    kind TEXT NOT NULL,      -- 'rejected' (4xx) or 'poisoned' (5xx for this record alone)
    reason TEXT NOT NULL,    -- the server's last answer
    at TEXT NOT NULL,        -- UTC, when it was set aside
    body TEXT NOT NULL,
    attempts INTEGER NOT NULL DEFAULT 1,  -- failed tries: the one that set it aside, then retries
    since REAL NOT NULL DEFAULT 0,        -- Unix time it was set aside (`at` as a number)
    tried_at REAL NOT NULL DEFAULT 0      -- Unix time of its last failed try
);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""
# Version 1 files: set_aside without the retry columns; `since` and `tried_at` from `at`.
_UPGRADE_1_TO_2 = """
ALTER TABLE set_aside ADD COLUMN attempts INTEGER NOT NULL DEFAULT 1;
ALTER TABLE set_aside ADD COLUMN since REAL NOT NULL DEFAULT 0;
ALTER TABLE set_aside ADD COLUMN tried_at REAL NOT NULL DEFAULT 0;
UPDATE set_aside SET since = coalesce(CAST(strftime('%s', at) AS REAL), 0);
UPDATE set_aside SET tried_at = since;
"""
RUN_KEY = "run"  # meta: the run's registration body (POST /api/v1/runs), JSON
FINAL_KEY = "final"  # meta: the run's final status (PATCH /api/v1/runs/{id}) not yet delivered, JSON
_CORRUPTION = {"SQLITE_CORRUPT", "SQLITE_NOTADB"}  # the file is damaged; anything else is I/O
DAMAGED_MARK = ".corrupt-"  # a damaged spool set aside: <name>.corrupt-<time>, with its -wal and -shm


class SpoolError(Exception):
    """The spool could not be read or written: disk full, I/O error, read-only, damaged file."""


class SpoolDamaged(SpoolError):
    """The file is damaged, and left where it is (a Spool opened with quarantine=False)."""


class Entry(NamedTuple):
    """One spooled record: its place in the delivery order and its JSON."""

    id: int
    body: str

    @property
    def record(self) -> dict[str, Any]:
        return json.loads(self.body)


def encode(record: dict[str, Any]) -> str:
    """The record's wire form. ASCII (json's default), so len() is its size in bytes."""
    return json.dumps(record, separators=(",", ":"))


class Spool:
    """Opened lazily, by whichever thread first needs it; every method is thread-safe."""

    def __init__(self, path: Path, max_bytes: int, quarantine: bool = True) -> None:
        self.path = path
        self.max_bytes = max_bytes
        # True: a damaged file is moved aside and a fresh spool started (the agent's way); False:
        # SpoolDamaged is raised and the file left for `salvage` (packscope sync's way).
        self.quarantine = quarantine
        self.evicted = 0  # records evicted by this process to stay under max_bytes
        self.quarantined: Path | None = None  # where a damaged spool file was moved aside
        self._count = 0
        self._bytes = 0
        self._db: sqlite3.Connection | None = None
        self._closed = False
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return self._count

    @property
    def bytes(self) -> int:
        """The size of the spooled records' JSON (the file adds SQLite's pages and its WAL)."""
        return self._bytes

    # -- opening ---------------------------------------------------------------------------------
    def open(self) -> None:
        """Open (or create) the file; a damaged one is moved aside and a fresh one started."""
        with self._lock:
            self._closed = False
            self._ensure_open()

    def _ensure_open(self) -> sqlite3.Connection:
        if self._db is not None:
            return self._db
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            try:
                self._db = self._connect()
            except sqlite3.DatabaseError as exc:
                if getattr(exc, "sqlite_errorname", "") not in _CORRUPTION:
                    raise
                if not self.quarantine:
                    raise SpoolDamaged(f"spool {self.path}: {exc}") from None
                self._quarantine(exc)
                self._db = self._connect()
            self._read_totals()
        except SpoolDamaged:
            raise
        except (sqlite3.Error, OSError) as exc:
            self._drop_connection()
            if getattr(exc, "sqlite_errorname", "") in _CORRUPTION and not self.quarantine:
                raise SpoolDamaged(f"spool {self.path}: {exc}") from None
            raise SpoolError(f"cannot open the spool {self.path}: {exc}") from None
        return self._db

    def _connect(self) -> sqlite3.Connection:
        # isolation_level=None: transactions are ours (BEGIN IMMEDIATE ... COMMIT), not implicit.
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False, timeout=10.0)
        try:
            # 16 KiB pages hold ~10 records of 1-2 KB (4 KiB pages hold 2, wasting ~30% of the file).
            # Only a new file takes it; it must come before WAL mode.
            db.execute("PRAGMA page_size=16384")
            db.execute("PRAGMA journal_mode=WAL")
            # Checkpoint every 256 pages (4 MiB) and cut the WAL back to that size afterwards.
            db.execute("PRAGMA wal_autocheckpoint=256")
            db.execute(f"PRAGMA journal_size_limit={4 * 1024 * 1024}")
            db.executescript(_SCHEMA)
            columns = {row[1] for row in db.execute("PRAGMA table_info(set_aside)")}
            if "attempts" not in columns:  # a version 1 file
                db.executescript(f"BEGIN IMMEDIATE; {_UPGRADE_1_TO_2} COMMIT;")
            if db.execute("PRAGMA user_version").fetchone()[0] < FORMAT_VERSION:
                db.execute(f"PRAGMA user_version={FORMAT_VERSION}")
        except BaseException:
            db.close()
            raise
        return db

    def _quarantine(self, exc: sqlite3.DatabaseError) -> None:
        aside = self.path.with_name(damaged_copy_name(self.path))
        for suffix in ("", "-wal", "-shm"):
            src = Path(f"{self.path}{suffix}")
            if src.exists():
                os.replace(src, f"{aside}{suffix}")
        self.quarantined = aside
        log.error(
            "packscope: the spool %s is damaged (%s); moved to %s, its records are NOT replayed; starting a new spool",
            self.path,
            exc,
            aside,
        )

    def _read_totals(self) -> None:
        assert self._db is not None
        self._count, self._bytes = self._db.execute("SELECT records, bytes FROM totals").fetchone()

    # -- writing ---------------------------------------------------------------------------------
    def append(self, bodies: list[str]) -> int:
        """Commit records (encoded with `encode`) after every other; returns how many of the
        oldest were evicted to stay under max_bytes. Raises SpoolError: then nothing was kept."""
        if not bodies:
            return 0
        with self._lock, self._guard():
            with self._transaction() as db:
                self._insert(db, bodies)
                evicted = self._evict_oldest(db)
            self._read_totals()
        if evicted:
            self.evicted += evicted
            log.warning(
                "packscope spool over %d bytes: evicted the %d oldest interval records (%d in total)",
                self.max_bytes,
                evicted,
                self.evicted,
            )
        return evicted

    @staticmethod
    def _insert(db: sqlite3.Connection, bodies: list[str]) -> None:
        db.executemany("INSERT INTO records (body, size) VALUES (?, ?)", ((b, len(b)) for b in bodies))
        db.execute(
            "UPDATE totals SET records = records + ?, bytes = bytes + ?", (len(bodies), sum(len(b) for b in bodies))
        )

    def _evict_oldest(self, db: sqlite3.Connection) -> int:
        """Delete the oldest records until the total fits; reads only the rows it deletes."""
        total = db.execute("SELECT bytes FROM totals").fetchone()[0]
        excess = total - self.max_bytes
        if excess <= 0:
            return 0
        newest = db.execute("SELECT max(id) FROM records").fetchone()[0]
        count = freed = 0
        last_id = None
        for row_id, size in db.execute("SELECT id, size FROM records WHERE id < ? ORDER BY id", (newest,)):
            count, freed, last_id = count + 1, freed + size, row_id
            if freed >= excess:
                break
        if last_id is not None:  # never the newest record, even when it alone is over the limit
            db.execute("DELETE FROM records WHERE id <= ?", (last_id,))
            db.execute("UPDATE totals SET records = records - ?, bytes = bytes - ?", (count, freed))
        return count

    def ack(self, entries: list[Entry]) -> None:
        """The server has these: delete them."""
        with self._lock, self._guard():
            with self._transaction(durable=False) as db:
                self._delete(db, [e.id for e in entries])
            self._read_totals()

    def set_aside(self, entries: list[Entry], kind: str, reason: str) -> None:
        """Move records the server will not take out of the delivery order, with the reason."""
        at, now = _utc_now(), time.time()
        with self._lock, self._guard():
            with self._transaction(durable=False) as db:
                db.executemany(
                    "INSERT OR REPLACE INTO set_aside (id, kind, reason, at, body, attempts, since, tried_at) "
                    "VALUES (?, ?, ?, ?, ?, 1, ?, ?)",
                    [(e.id, kind, reason, at, e.body, now, now) for e in entries],
                )
                self._delete(db, [e.id for e in entries])
            self._read_totals()

    def due_set_aside(
        self,
        n: int,
        retry_s: float = SET_ASIDE_RETRY_S,
        max_attempts: int = SET_ASIDE_MAX_ATTEMPTS,
        max_age_s: float = SET_ASIDE_MAX_AGE_S,
        now: float | None = None,
    ) -> list[Entry]:
        """Up to n set-aside records due for another try, oldest first: failed fewer than
        max_attempts times, set aside less than max_age_s ago, and last tried at least
        retry_s * 2**(attempts - 1) ago (retry_s=0: whenever they are within the caps)."""
        now = time.time() if now is None else now
        with self._lock, self._guard():
            if not self._readable():
                return []
            rows = (
                self._ensure_open()
                .execute(
                    "SELECT id, body FROM set_aside WHERE attempts < ? AND since > ? "
                    "AND tried_at + ? * (1 << (attempts - 1)) <= ? ORDER BY id LIMIT ?",
                    (max_attempts, now - max_age_s, retry_s, now, n),
                )
                .fetchall()
            )
        return [Entry(*row) for row in rows]

    def delivered_set_aside(self, entries: list[Entry]) -> None:
        """Set-aside records the server has now taken: gone from the file."""
        with self._lock, self._guard(), self._transaction(durable=False) as db:
            db.executemany("DELETE FROM set_aside WHERE id = ?", [(e.id,) for e in entries])

    def failed_again(self, entries: list[Entry], reason: str) -> None:
        """Set-aside records the server refused once more: one more attempt, the latest reason."""
        now = time.time()
        with self._lock, self._guard(), self._transaction(durable=False) as db:
            db.executemany(
                "UPDATE set_aside SET attempts = attempts + 1, tried_at = ?, reason = ? WHERE id = ?",
                [(now, reason, e.id) for e in entries],
            )

    # -- the run's own facts ------------------------------------------------------------------
    def set_meta(self, key: str, value: object | None) -> None:
        """Keep `value` (JSON) under `key`, durably; None deletes it."""
        with self._lock, self._guard(), self._transaction() as db:
            if value is None:
                db.execute("DELETE FROM meta WHERE key = ?", (key,))
            else:
                db.execute("INSERT OR REPLACE INTO meta VALUES (?, ?)", (key, json.dumps(value, default=str)))

    def meta(self, key: str) -> Any:
        """The JSON value kept under `key`, None when there is none."""
        with self._lock, self._guard():
            if not self._readable():
                return None
            row = self._ensure_open().execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    @staticmethod
    def _delete(db: sqlite3.Connection, ids: list[int]) -> None:
        marks = ",".join("?" * len(ids))
        # Count what is really there: another process with the same run_id may have taken some.
        where = f"WHERE id IN ({marks})"
        count, size = db.execute(f"SELECT count(*), coalesce(sum(size), 0) FROM records {where}", ids).fetchone()
        db.execute(f"DELETE FROM records {where}", ids)
        db.execute("UPDATE totals SET records = records - ?, bytes = bytes - ?", (count, size))

    # -- reading ---------------------------------------------------------------------------------
    def head(self, n: int, skip: int = 0) -> list[Entry]:
        """The n oldest records, after skipping the `skip` oldest."""
        with self._lock, self._guard():
            if not self._readable():
                return []
            db = self._ensure_open()
            rows = db.execute("SELECT id, body FROM records ORDER BY id LIMIT ? OFFSET ?", (n, skip)).fetchall()
        return [Entry(*row) for row in rows]

    def peek(self, n: int) -> list[dict[str, Any]]:
        """The n oldest records, decoded (for inspection)."""
        return [e.record for e in self.head(n)]

    def set_aside_records(self) -> list[tuple[str, str, dict[str, Any] | str]]:
        """(kind, reason, record) for every record set aside in this file, oldest first; the
        record is its raw text when it is not JSON (a damaged row the server refused)."""
        with self._lock, self._guard():
            if not self._readable():
                return []
            rows = self._ensure_open().execute("SELECT kind, reason, body FROM set_aside ORDER BY id").fetchall()
        return [(kind, reason, _decoded(body)) for kind, reason, body in rows]

    def _readable(self) -> bool:
        # After close, reading reopens the file if it is still there, but never creates one.
        return self._db is not None or not self._closed or self.path.exists()

    # -- closing ---------------------------------------------------------------------------------
    def set_aside_count(self) -> int:
        with self._lock, self._guard():
            if not self._readable():
                return 0
            return int(self._ensure_open().execute("SELECT count(*) FROM set_aside").fetchone()[0])

    def close(self, remove_if_empty: bool = True) -> None:
        """Close the file; remove it when nothing waits in it: no record, none set aside, and no
        final status still to deliver."""
        with self._lock:
            db, self._closed = self._db, True
            if db is None:
                return
            try:
                empty = (
                    not self._count
                    and db.execute("SELECT 1 FROM set_aside LIMIT 1").fetchone() is None
                    and db.execute("SELECT 1 FROM meta WHERE key = ?", (FINAL_KEY,)).fetchone() is None
                )
            except sqlite3.Error:
                empty = False
            self._drop_connection()
            if remove_if_empty and empty:
                for suffix in ("", "-wal", "-shm"):
                    Path(f"{self.path}{suffix}").unlink(missing_ok=True)

    def _drop_connection(self) -> None:
        if self._db is not None:
            with suppress(sqlite3.Error):
                self._db.close()
            self._db = None

    # -- helpers ---------------------------------------------------------------------------------
    @contextmanager
    def _transaction(self, durable: bool = True) -> Iterator[sqlite3.Connection]:
        """durable: the commit is on the disk when it returns (synchronous=FULL syncs the WAL),
        so a power cut cannot lose it; what a commit adds is made durable this way. A commit
        that only deletes (delivered or set-aside records) skips the sync: all a power cut can
        do is undo it, and the records are then sent again, as duplicates. Any commit, synced
        or not, survives a kill -9: it is in the WAL file before COMMIT returns."""
        db = self._ensure_open()
        db.execute(f"PRAGMA synchronous={'FULL' if durable else 'NORMAL'}")  # not allowed inside BEGIN
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
            db.execute("COMMIT")
        except BaseException:
            if db.in_transaction:
                db.execute("ROLLBACK")
            raise

    @contextmanager
    def _guard(self) -> Iterator[None]:
        """SQLite and OS errors become SpoolError; a file found damaged is moved aside, so the
        next call starts a fresh spool instead of failing forever."""
        try:
            yield
        except SpoolError:
            raise
        except sqlite3.DatabaseError as exc:
            if getattr(exc, "sqlite_errorname", "") in _CORRUPTION:
                self._drop_connection()
                self._count = self._bytes = 0
                if not self.quarantine:
                    raise SpoolDamaged(f"spool {self.path}: {exc}") from None
                try:
                    self._quarantine(exc)
                except OSError as move_exc:
                    log.error("packscope: could not move the damaged spool %s aside: %s", self.path, move_exc)
            raise SpoolError(f"spool {self.path}: {exc}") from None
        except (sqlite3.Error, OSError) as exc:
            raise SpoolError(f"spool {self.path}: {exc}") from None


def damaged_copy_name(path: Path) -> str:
    """The name a damaged spool is set aside under, beside it."""
    return f"{path.name}{DAMAGED_MARK}{time.strftime('%Y%m%dT%H%M%S')}"


def is_damaged_copy(path: Path) -> bool:
    """Whether the file is a damaged spool set aside (not its -wal or -shm)."""
    return DAMAGED_MARK in path.name and not path.name.endswith(("-wal", "-shm"))


def _decoded(body: str) -> dict[str, Any] | str:
    try:
        return json.loads(body)
    except ValueError:
        return body


def _utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
