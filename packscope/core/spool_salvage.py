"""What can still be read of a damaged spool (packscope/core/spool.py), rebuilt into a sound one.

A spool is one SQLite file. A damaged page (a disk fault, a bad copy) makes every read that
crosses it fail ("database disk image is malformed", or rows that cannot be records), while the
rows on the other pages still read: records are keyed by an increasing id, so a read that starts
past the damaged page's ids never touches it. `salvage` reads the records and the set-aside rows
in id order, row by row; where a read fails it searches forward for the first id a read can
start from again (doubling steps, then halving), so only the ids whose reads cross the damage
are left out. The rows read, the run's registration and its final status go into a new file that
replaces the damaged one in one rename; the damaged file is kept beside it as
`<name>.corrupt-<time>` (the name the agent gives one it moves aside) unless nothing was lost.

Used by `packscope sync`; the agent's sender moves a damaged spool aside unread (spool.py).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
from collections.abc import Callable
from contextlib import closing, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packscope.core.spool import FINAL_KEY, RUN_KEY, Spool, SpoolError, damaged_copy_name

_LAST_ID = 2**62  # when not even the id sequence reads: search up to any id SQLite hands out
Row = tuple[Any, ...]
_ASIDE_COLUMNS = "kind, reason, at, body, attempts, since, tried_at"  # after id, as the table declares them


@dataclass
class Salvage:
    """What salvaging a damaged spool kept and what it could not read."""

    path: Path  # the spool, rebuilt from what was read
    kept_at: Path | None  # the damaged file, kept as it was; None when nothing was lost
    records: int  # records read and kept
    set_aside: int  # set-aside rows read and kept
    lost: int | None  # records the damaged file held that could not be read; None: not known
    unreadable: list[str] = field(default_factory=list)  # what could not be read, e.g. "record ids 601-620"

    @property
    def complete(self) -> bool:
        return self.lost == 0 and not self.unreadable

    def describe(self) -> str:
        if self.complete:
            return f"{self.path}: the spool was damaged; every record in it was read into a new file"
        lost = "an unknown number of" if self.lost is None else str(self.lost)
        return (
            f"{self.path}: the spool was damaged: {lost} records could not be read ({'; '.join(self.unreadable)}) "
            f"and are not sent; the damaged file is kept as {self.kept_at}"
        )


def salvage(path: Path) -> Salvage:
    """Rebuild the damaged spool at `path` from every row that reads; SpoolError when even its
    run's registration does not (then the file is left as it is)."""
    try:
        with closing(sqlite3.connect(path, isolation_level=None)) as db:
            db.execute("PRAGMA query_only=1")  # nothing is written to the damaged file
            read = _read_all(db)
    except sqlite3.Error as exc:  # not even its schema reads
        raise SpoolError(f"spool {path}: damaged beyond reading ({exc}); left as it is") from None
    if read.run is None:
        raise SpoolError(f"spool {path}: damaged, and its run's registration cannot be read; left as it is")
    tmp = path.with_name(path.name + ".salvage")
    _remove(tmp)
    _write(tmp, read)
    result = Salvage(path, None, len(read.records), len(read.set_aside), read.lost, read.unreadable)
    if not result.complete:
        result.kept_at = path.with_name(damaged_copy_name(path))
        for suffix in ("", "-wal"):  # closing read the WAL into the file; a WAL left is kept with it
            if Path(f"{path}{suffix}").exists():
                shutil.copy2(f"{path}{suffix}", f"{result.kept_at}{suffix}")
    for suffix in ("-wal", "-shm"):  # the damaged file's: they must not be read into the new one
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    os.replace(tmp, path)  # a kill leaves the damaged file or the rebuilt one, never half of one
    return result


@dataclass
class _Read:
    run: Any = None
    final: Any = None
    records: list[Row] = field(default_factory=list)  # (id, body)
    set_aside: list[Row] = field(default_factory=list)  # (id, kind, reason, at, body, attempts, since, tried_at)
    lost: int | None = None
    unreadable: list[str] = field(default_factory=list)


def _read_all(db: sqlite3.Connection) -> _Read:
    read = _Read()
    read.run = _meta(db, RUN_KEY, read)
    read.final = _meta(db, FINAL_KEY, read)
    last = _last_id(db)
    read.records, gaps = _rows(db, "records", "body", last, _is_record)
    read.set_aside, aside_gaps = _rows(db, "set_aside", _ASIDE_COLUMNS, last, _is_aside)
    held = _one(db, "SELECT records FROM totals")
    read.lost = None if held is None else max(0, int(held) - len(read.records))
    if gaps and read.lost != 0:
        read.unreadable.append("record ids " + ", ".join(_span(*gap) for gap in gaps))
    if aside_gaps:
        read.unreadable.append("set-aside record ids " + ", ".join(_span(*gap) for gap in aside_gaps))
        read.lost = None  # set-aside rows have no count of their own
    if held is None:
        read.unreadable.append("the count of records it held")
    return read


def _meta(db: sqlite3.Connection, key: str, read: _Read) -> Any:
    try:
        row = db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else json.loads(row[0])
    except (sqlite3.DatabaseError, ValueError, TypeError):
        read.unreadable.append({RUN_KEY: "the run's registration", FINAL_KEY: "the run's final status"}[key])
        return None


def _last_id(db: sqlite3.Connection) -> int:
    """The largest id ever given a record (AUTOINCREMENT's sequence), or the largest stored."""
    for sql in ("SELECT seq FROM sqlite_sequence WHERE name = 'records'", "SELECT max(id) FROM records"):
        value = _one(db, sql)
        if isinstance(value, int):
            return value
    return _LAST_ID


def _one(db: sqlite3.Connection, sql: str) -> Any:
    try:
        row = db.execute(sql).fetchone()
    except sqlite3.DatabaseError:
        return None
    return None if row is None else row[0]


class _Unsound(Exception):
    """A row that cannot be one of the table's: read from a damaged page."""


def _rows(
    db: sqlite3.Connection, table: str, columns: str, last: int, sound: Callable[[Row], bool]
) -> tuple[list[Row], list[tuple[int, int]]]:
    """The table's readable rows in id order, and the id ranges that could not be read."""
    rows: list[Row] = []
    gaps: list[tuple[int, int]] = []
    after = 0  # ids start at 1
    while after < last:
        try:
            for row in db.execute(f"SELECT id, {columns} FROM {table} WHERE id > ? ORDER BY id", (after,)):
                if not (after < row[0] <= last and sound(row)):
                    raise _Unsound
                rows.append(row)
                after = row[0]
            break
        except (sqlite3.DatabaseError, _Unsound):
            pass
        # sqlite3's cursor steps a row ahead, so the rows just before the damage are read one at a time.
        while isinstance(row := _first(db, table, columns, after + 1, last, sound), tuple):
            rows.append(row)
            after = row[0]
        if row is None:  # no row after them: the damage ended the table
            break
        resume = _next_readable(db, table, columns, after, last, sound)
        gaps.append((after + 1, resume - 1))
        after = resume - 1
    return rows, gaps


_UNREADABLE = "unreadable"


def _first(
    db: sqlite3.Connection, table: str, columns: str, first: int, last: int, sound: Callable[[Row], bool]
) -> Row | str | None:
    """The table's first row from id `first` on (LIMIT 1: no step beyond it), None when there is
    none, _UNREADABLE when the read fails or the row cannot be one of the table's."""
    try:
        sql = f"SELECT id, {columns} FROM {table} WHERE id >= ? ORDER BY id LIMIT 1"
        row: Row | None = db.execute(sql, (first,)).fetchone()
    except sqlite3.DatabaseError:
        return _UNREADABLE
    if row is None:
        return None
    return row if first <= row[0] <= last and sound(row) else _UNREADABLE


def _next_readable(
    db: sqlite3.Connection, table: str, columns: str, after: int, last: int, sound: Callable[[Row], bool]
) -> int:
    """The smallest id past `after` + 1 that a read can start from (last + 1: none)."""

    def starts(first: int) -> bool:
        return _first(db, table, columns, first, last, sound) != _UNREADABLE

    bad, step = after + 1, 1  # the read from after + 1 has just failed
    good = min(bad + step, last + 1)
    while good <= last and not starts(good):
        bad, step = good, step * 2
        good = min(bad + step, last + 1)
    while good - bad > 1:
        middle = (bad + good) // 2
        bad, good = (bad, middle) if starts(middle) else (middle, good)
    return good


def _is_record(row: Row) -> bool:
    return isinstance(row[1], str) and _is_object(row[1])


def _is_aside(row: Row) -> bool:
    # A set-aside body may be any text (the server refused it); its other columns say whether the row is sound.
    _, kind, reason, _at, body, attempts, since, tried_at = row
    texts = isinstance(reason, str) and isinstance(body, str)
    numbers = isinstance(attempts, int) and all(isinstance(v, int | float) for v in (since, tried_at))
    return kind in ("rejected", "poisoned") and texts and numbers


def _is_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _span(first: int, last: int) -> str:
    if last >= _LAST_ID:
        return f"{first} on"
    return str(first) if first == last else f"{first}-{last}"


def _write(tmp: Path, read: _Read) -> None:
    """A new spool holding what was read, committed and closed (no WAL left beside it)."""
    fresh = Spool(tmp, max_bytes=2**62)
    fresh.open()  # the schema, the page size, WAL mode and the format version
    fresh.close(remove_if_empty=False)
    with closing(sqlite3.connect(tmp, isolation_level=None)) as db:
        db.execute("PRAGMA synchronous=FULL")
        db.execute("BEGIN IMMEDIATE")
        rows = [(row_id, body, len(body)) for row_id, body in read.records]
        db.executemany("INSERT INTO records (id, body, size) VALUES (?, ?, ?)", rows)
        db.execute(
            "UPDATE totals SET records = ?, bytes = ?", (len(read.records), sum(len(b) for _, b in read.records))
        )
        db.executemany("INSERT INTO set_aside VALUES (?, ?, ?, ?, ?, ?, ?, ?)", read.set_aside)
        for key, value in ((RUN_KEY, read.run), (FINAL_KEY, read.final)):
            if value is not None:
                db.execute("INSERT INTO meta VALUES (?, ?)", (key, json.dumps(value, default=str)))
        db.execute("COMMIT")


def _remove(path: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        with suppress(FileNotFoundError):
            Path(f"{path}{suffix}").unlink()
