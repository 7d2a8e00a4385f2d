"""A damaged spool's readable rows are rebuilt into a sound file: exactly the rows SQLite can still
read (each one as it was written), what cannot be read is counted and named, and the damaged file
is kept beside it."""

from __future__ import annotations

import json
import random
import sqlite3
from pathlib import Path

import pytest

from packscope.core.spool import FINAL_KEY, RUN_KEY, Spool, SpoolError, encode
from packscope.core.spool_salvage import salvage

RUN = {"run_id": "salvaged", "model": {"layers": 2}}


def spool_of(path: Path, n: int) -> dict[int, str]:
    """A spool of n records (~1 KB each) with the run, its final status and one set-aside record;
    its bodies by id."""
    spool = Spool(path, max_bytes=2**40)
    spool.open()
    spool.set_meta(RUN_KEY, RUN)
    spool.append([encode({"interval": k, "rank": 0, "pad": "x" * 1000}) for k in range(n)])
    spool.set_aside(spool.head(1), "rejected", "422: tokens")
    spool.set_meta(FINAL_KEY, {"status": "finished"})
    spool.close(remove_if_empty=False)
    with sqlite3.connect(path) as db:
        return dict(db.execute("SELECT id, body FROM records"))


def damage(path: Path, offset: int, size: int = 8192) -> None:
    with path.open("r+b") as f:
        f.seek(offset)
        f.write(random.Random(offset).randbytes(size))


def rows(path: Path, sql: str) -> list[tuple]:
    db = sqlite3.connect(path)
    try:
        return db.execute(sql).fetchall()
    finally:
        db.close()


@pytest.mark.parametrize("where", [0.3, 0.6, 0.999])  # mid-file, and the last page
def test_every_readable_record_is_kept_as_written_and_the_rest_is_counted(tmp_path, where):
    path = tmp_path / "salvaged.sqlite"
    written = spool_of(path, 2000)
    damage(path, int(path.stat().st_size * where) - 8192)
    with pytest.raises(sqlite3.DatabaseError):  # the damage is real: reading every record fails
        rows(path, "SELECT id, body FROM records")
    damaged = path.read_bytes()
    result = salvage(path)
    assert rows(path, "PRAGMA integrity_check") == [("ok",)]
    kept = dict(rows(path, "SELECT id, body FROM records"))
    assert kept.items() <= written.items()  # every record kept is one written, under its id
    assert result.records == len(kept) and result.lost == len(written) - len(kept)
    assert 0 < result.lost <= 40  # 8 KiB spoil about a page (10-15 records), not what follows it
    lost_ids = sorted(written.keys() - kept.keys())
    assert f"record ids {lost_ids[0]}" in result.unreadable[0]
    assert rows(path, "SELECT records, bytes FROM totals") == [(len(kept), sum(map(len, kept.values())))]
    assert json.loads(rows(path, "SELECT value FROM meta WHERE key = 'run'")[0][0]) == RUN
    assert rows(path, "SELECT kind, reason FROM set_aside") == [("rejected", "422: tokens")]
    assert result.kept_at is not None and result.kept_at.name.startswith("salvaged.sqlite.corrupt-")
    assert result.kept_at.read_bytes() == damaged  # kept as it was, for a look
    assert f"{result.lost} records could not be read" in result.describe() and str(result.kept_at) in result.describe()


def test_a_spool_whose_run_cannot_be_read_is_left_as_it_is(tmp_path):
    path = tmp_path / "salvaged.sqlite"
    path.write_bytes(b"SQLite format 3\x00" + b"\x00" * 100 + b"garbage" * 1000)
    before = path.read_bytes()
    with pytest.raises(SpoolError, match="left as it is"):
        salvage(path)
    assert path.read_bytes() == before and [p.name for p in tmp_path.iterdir()] == ["salvaged.sqlite"]
