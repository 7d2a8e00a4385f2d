"""The spool on its own: order, durability across processes and kill -9, eviction, set-aside
records, damaged files, and costs that do not grow with its size."""

from __future__ import annotations

import json
import logging
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

import packscope.core.spool as spool_module
from packscope.core.spool import Spool, SpoolError, encode

SPOOL_FILE = Path(spool_module.__file__)


def body(i: int, size: int = 150) -> str:
    """A record whose JSON is exactly `size` bytes, whatever its interval."""
    bare = len(encode({"rank": 0, "interval": i, "pad": ""}))
    return encode({"rank": 0, "interval": i, "pad": "x" * (size - bare)})


def intervals(entries) -> list[int]:
    return [e.record["interval"] for e in entries]


def scan(path: Path) -> tuple[list[int], int, tuple[int, int]]:
    """What is really in the file, read with a connection of our own: (intervals in order,
    their bytes, the totals row)."""
    db = sqlite3.connect(path)
    try:
        rows = db.execute("SELECT body, size FROM records ORDER BY id").fetchall()
        totals = db.execute("SELECT records, bytes FROM totals").fetchone()
    finally:
        db.close()
    return [json.loads(b)["interval"] for b, _ in rows], sum(s for _, s in rows), totals


def test_records_come_back_oldest_first_and_acked_ones_are_gone(tmp_path):
    spool = Spool(tmp_path / "run.sqlite", max_bytes=10**6)
    spool.append([body(i) for i in range(5)])
    spool.append([body(i) for i in range(5, 8)])
    assert len(spool) == 8
    head = spool.head(3)
    assert intervals(head) == [0, 1, 2]
    assert intervals(spool.head(2, skip=3)) == [3, 4]
    spool.ack(head)
    assert len(spool) == 5 and intervals(spool.head(100)) == [3, 4, 5, 6, 7]
    spool.ack(head)  # acknowledging twice changes nothing
    assert len(spool) == 5
    spool.close()

    again = Spool(tmp_path / "run.sqlite", max_bytes=10**6)  # what a later process finds
    again.open()
    assert len(again) == 5 and again.bytes == sum(len(body(i)) for i in range(3, 8))
    assert intervals(again.head(100)) == [3, 4, 5, 6, 7]
    again.close()
    order, size, totals = scan(tmp_path / "run.sqlite")
    assert order == [3, 4, 5, 6, 7] and totals == (5, size)


def test_close_removes_an_empty_spool_and_keeps_one_with_records(tmp_path):
    empty = Spool(tmp_path / "empty.sqlite", max_bytes=10**6)
    empty.append([body(0)])
    empty.ack(empty.head(1))
    empty.close()
    assert not list(tmp_path.glob("empty.sqlite*"))
    assert empty.head(1) == []  # reading a removed spool does not create it again
    assert not list(tmp_path.glob("empty.sqlite*"))

    full = Spool(tmp_path / "full.sqlite", max_bytes=10**6)
    full.append([body(0)])
    full.close()
    assert (tmp_path / "full.sqlite").exists()
    assert intervals(full.head(5)) == [0]  # still readable after close


def test_eviction_drops_the_oldest_counts_and_logs_them(tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="packscope.agent")
    one = len(body(0))
    spool = Spool(tmp_path / "run.sqlite", max_bytes=10 * one)
    for i in range(25):
        spool.append([body(i)])
    assert intervals(spool.head(100)) == list(range(15, 25))  # the newest, in order
    assert spool.evicted == 15 and len(spool) == 10 and spool.bytes <= 10 * one
    spool.append([body(i) for i in range(25, 32)])  # a batch: evicts across old and new
    assert intervals(spool.head(100)) == list(range(22, 32)) and spool.evicted == 22
    messages = [r.getMessage() for r in caplog.records if "evicted" in r.getMessage()]
    assert len(messages) == 16 and "(22 in total)" in messages[-1]
    spool.close()
    order, size, totals = scan(tmp_path / "run.sqlite")
    assert order == list(range(22, 32)) and totals == (10, size)


def test_eviction_never_drops_the_newest_record_even_alone_over_the_limit(tmp_path):
    spool = Spool(tmp_path / "run.sqlite", max_bytes=50)
    spool.append([body(0), body(1)])
    spool.append([body(2, size=500)])
    assert intervals(spool.head(10)) == [2] and spool.evicted == 2
    spool.append([body(3, size=500), body(4, size=500)])
    assert intervals(spool.head(10)) == [4] and spool.evicted == 4
    spool.close()


def test_set_aside_records_leave_the_delivery_order_with_their_reason(tmp_path):
    spool = Spool(tmp_path / "run.sqlite", max_bytes=10**6)
    spool.append([body(i) for i in range(4)])
    head = spool.head(4)
    spool.set_aside([head[1]], "rejected", "HTTP 422: bad field")
    spool.set_aside([head[2]], "poisoned", "HTTP 500: boom")
    assert intervals(spool.head(10)) == [0, 3] and len(spool) == 2
    spool.ack(spool.head(10))
    spool.close()
    assert (tmp_path / "run.sqlite").exists()  # set-aside records keep the file
    again = Spool(tmp_path / "run.sqlite", max_bytes=10**6)
    aside = again.set_aside_records()
    assert [(kind, reason, r["interval"]) for kind, reason, r in aside] == [
        ("rejected", "HTTP 422: bad field", 1),
        ("poisoned", "HTTP 500: boom", 2),
    ]
    assert len(again) == 0
    again.close()


def test_a_damaged_file_is_moved_aside_and_a_new_spool_started(tmp_path, caplog):
    path = tmp_path / "run.sqlite"
    path.write_bytes(b"this is not a database, it was torn or overwritten" * 100)
    spool = Spool(path, max_bytes=10**6)
    spool.append([body(1)])
    assert spool.quarantined is not None and spool.quarantined.read_bytes().startswith(b"this is not")
    assert intervals(spool.head(5)) == [1]
    assert any("damaged" in r.getMessage() and r.levelno == logging.ERROR for r in caplog.records)
    spool.close()


def test_an_unusable_directory_raises_spool_error(tmp_path):
    (tmp_path / "a-file").write_text("")
    spool = Spool(tmp_path / "a-file" / "run.sqlite", max_bytes=10**6)
    with pytest.raises(SpoolError):
        spool.append([body(0)])
    assert len(spool) == 0


# A child process that appends in a loop and prints how many records it has committed. It loads
# the spool module alone: the spool needs the standard library only (no torch import).
APPENDER = r"""
import importlib.util, sys
spec = importlib.util.spec_from_file_location("spool", sys.argv[1])
spool_module = importlib.util.module_from_spec(spec); spec.loader.exec_module(spool_module)
spool = spool_module.Spool(spool_module.Path(sys.argv[2]), max_bytes=10**9)
i = int(sys.argv[3])
while True:
    spool.append([spool_module.encode({"rank": 0, "interval": i + k, "pad": "x" * 300}) for k in range(7)])
    i += 7
    print(i, flush=True)
"""


def test_kill_9_mid_append_loses_nothing_committed_and_stores_nothing_twice(tmp_path):
    path = tmp_path / "run.sqlite"
    committed_through = 0
    for round_ in range(4):
        child = subprocess.Popen(
            [sys.executable, "-c", APPENDER, str(SPOOL_FILE), str(path), str(committed_through)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert child.stdout is not None
        lines = [child.stdout.readline() for _ in range(20 + 15 * round_)]  # kill at a different point each time
        child.send_signal(signal.SIGKILL)
        rest, _ = child.communicate()
        reported = int([x for x in lines + rest.splitlines() if x.strip()][-1])
        order, size, totals = scan(path)
        # Everything reported committed is there; at most the batch in flight at the kill is
        # there without having been reported; nothing is there twice.
        assert order[:reported] == list(range(reported))
        assert len(order) in (reported, reported + 7)
        assert order == list(range(len(order))) and totals == (len(order), size)
        committed_through = len(order)
    assert committed_through >= 4 * 7 * 20


@pytest.mark.alone  # compares timings taken one after the other
def test_append_head_ack_and_evict_cost_the_same_on_a_large_spool(tmp_path):
    """O(1) in the spool's size (the bench measures it up to 256 MiB): one cycle on a spool of
    50,000 records costs about what it costs on one of 1,000."""
    chunk = [body(i, size=1000) for i in range(1000)]

    def cycle_time(spool: Spool) -> float:
        best = float("inf")
        for _ in range(30):
            t0 = time.perf_counter()
            spool.append(chunk[:16])
            spool.ack(spool.head(16))
            best = min(best, time.perf_counter() - t0)
        return best

    def evict_time(spool: Spool) -> float:
        spool.max_bytes = spool.bytes - 16 * len(chunk[0])  # the next append evicts 32 records
        t0 = time.perf_counter()
        spool.append(chunk[:16])
        elapsed = time.perf_counter() - t0
        assert spool.evicted == 32
        return elapsed

    small = Spool(tmp_path / "small.sqlite", max_bytes=10**10)
    small.append(chunk)
    large = Spool(tmp_path / "large.sqlite", max_bytes=10**10)
    for _ in range(50):
        large.append(chunk)
    assert len(large) == 50_000
    t_small, t_large = cycle_time(small), cycle_time(large)
    assert t_large < 3 * t_small + 0.002, (t_small, t_large)
    e_small, e_large = evict_time(small), evict_time(large)
    assert e_large < 3 * e_small + 0.005, (e_small, e_large)
    t0 = time.perf_counter()
    reopened = Spool(tmp_path / "large.sqlite", max_bytes=10**10)
    reopened.open()  # the totals are a row, not a scan
    assert len(reopened) == 50_000 + 16 - 32 and time.perf_counter() - t0 < 0.5
    for s in (small, large, reopened):
        s.close()


# -- what a later process needs: the run's facts, and set-aside records tried again --------------
def test_the_runs_registration_and_final_status_are_kept_and_keep_the_file(tmp_path):
    spool = Spool(tmp_path / "run.sqlite", max_bytes=10**6)
    spool.set_meta("run", {"run_id": "r", "name": "n"})
    spool.set_meta("final", {"status": "finished"})
    spool.close()
    assert (tmp_path / "run.sqlite").exists()  # no record, but a final status still to deliver
    again = Spool(tmp_path / "run.sqlite", max_bytes=10**6)
    assert again.meta("run") == {"run_id": "r", "name": "n"} and again.meta("final") == {"status": "finished"}
    again.set_meta("final", None)
    assert again.meta("final") is None and again.meta("nothing here") is None
    again.close()
    assert not (tmp_path / "run.sqlite").exists()  # now nothing waits in it


def test_set_aside_records_come_due_at_doubling_waits_within_the_caps(tmp_path):
    spool = Spool(tmp_path / "run.sqlite", max_bytes=10**6)
    spool.append([body(i) for i in range(3)])
    spool.set_aside(spool.head(3), "rejected", "HTTP 422: no")
    t0 = time.time()
    assert spool.due_set_aside(10, retry_s=100, now=t0 + 50) == []  # not yet
    assert intervals(spool.due_set_aside(10, retry_s=100, now=t0 + 101)) == [0, 1, 2]
    assert intervals(spool.due_set_aside(2, retry_s=100, now=t0 + 101)) == [0, 1]  # oldest first
    first = spool.due_set_aside(1, retry_s=100, now=t0 + 101)
    spool.failed_again(first, "HTTP 422: still no")
    # Its second retry waits twice as long; the others are due as before.
    assert intervals(spool.due_set_aside(10, retry_s=100, now=time.time() + 150)) == [1, 2]
    assert intervals(spool.due_set_aside(10, retry_s=100, now=time.time() + 201)) == [0, 1, 2]
    spool.delivered_set_aside(spool.due_set_aside(1, retry_s=0, now=t0 + 1)[:1])
    assert [(k, why) for k, why, _ in spool.set_aside_records()] == [("rejected", "HTTP 422: no")] * 2
    for _ in range(3):
        spool.failed_again(spool.due_set_aside(1, retry_s=0), "HTTP 422: no")
    assert intervals(spool.due_set_aside(10, retry_s=0, max_attempts=4)) == [2]  # 1 has failed 4 times
    assert intervals(spool.due_set_aside(10, retry_s=0, max_attempts=5)) == [1, 2]
    assert spool.due_set_aside(10, retry_s=0, max_age_s=60, now=t0 + 61) == []  # too old
    assert spool.set_aside_count() == 2  # past the caps they stay, never dropped
    spool.close()


def test_a_version_1_file_is_upgraded_in_place_and_its_set_aside_records_dated(tmp_path):
    path = tmp_path / "run.sqlite"
    db = sqlite3.connect(path)  # what packscope wrote before the retry columns
    db.executescript(
        """
        CREATE TABLE records (id INTEGER PRIMARY KEY AUTOINCREMENT, body TEXT NOT NULL, size INTEGER NOT NULL);
        CREATE TABLE totals (one INTEGER PRIMARY KEY CHECK (one = 1), records INTEGER NOT NULL, bytes INTEGER NOT NULL);
        INSERT INTO totals VALUES (1, 1, 30);
        INSERT INTO records (body, size) VALUES ('{"rank":0,"interval":7,"x":""}', 30);
        CREATE TABLE set_aside (id INTEGER PRIMARY KEY, kind TEXT NOT NULL, reason TEXT NOT NULL,
                                at TEXT NOT NULL, body TEXT NOT NULL);
        INSERT INTO set_aside VALUES (5, 'poisoned', 'HTTP 500', '2020-01-02T03:04:05Z', '{"rank":0,"interval":5}');
        CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
        PRAGMA user_version=1;
        """
    )
    db.close()
    spool = Spool(path, max_bytes=10**6)
    spool.open()
    assert intervals(spool.head(5)) == [7] and len(spool) == 1
    assert spool.due_set_aside(5, retry_s=0, max_age_s=10**12)[0].record["interval"] == 5
    assert spool.due_set_aside(5, retry_s=0) == []  # set aside in 2020: past the week
    spool.close()
    db = sqlite3.connect(path)
    assert db.execute("PRAGMA user_version").fetchone()[0] == spool_module.FORMAT_VERSION == 2
    assert db.execute("SELECT since, tried_at, attempts FROM set_aside").fetchone() == (1577934245.0, 1577934245.0, 1)
    db.close()
