"""Migrating beside other processes: a deadlock's victim is done again, and on SQLite the start's
refresh runs under the migration lock (servers started together take turns, not the busy timeout)."""

import fcntl
import threading
import time

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

import packscope.backend.store.metric_values as metric_values
from packscope.backend.store.db import DEADLOCK_RETRIES, make_engine, retrying_deadlocks, upgrade_schema


def test_a_transaction_that_loses_a_deadlock_is_done_again(postgres):
    """A real deadlock: a reader holds `runs` and waits for `intervals`, which the "migration" has
    locked before it asks for `runs`. Its short deadlock_timeout makes it the one PostgreSQL rolls
    back; done again, it finds the reader gone and takes both."""
    engine = make_engine(postgres)
    upgrade_schema(engine)
    reader_holds_runs, reader_done = threading.Event(), threading.Event()

    def reader() -> None:
        with psycopg.connect(postgres.replace("+psycopg", "")) as connection:
            connection.execute("SET deadlock_timeout = '10s'")  # never the victim
            connection.execute("SELECT count(*) FROM runs")
            reader_holds_runs.set()
            connection.execute("SELECT count(*) FROM intervals")  # waits for the migration's lock
        reader_done.set()

    attempts: list[int] = []

    def migration() -> str:
        attempts.append(1)
        with engine.begin() as connection:
            connection.exec_driver_sql("SET LOCAL deadlock_timeout = '20ms'")
            connection.exec_driver_sql("LOCK TABLE intervals IN ACCESS EXCLUSIVE MODE")
            if len(attempts) == 1:
                threading.Thread(target=reader, daemon=True).start()
                assert reader_holds_runs.wait(10)
                deadline = time.monotonic() + 10
                while not _someone_waits(connection):  # the reader now waits for intervals
                    assert time.monotonic() < deadline, "the reader never waited for the lock"
                    time.sleep(0.01)
            connection.exec_driver_sql("LOCK TABLE runs IN ACCESS EXCLUSIVE MODE")
        return "migrated"

    try:
        assert retrying_deadlocks(migration) == "migrated"
        assert len(attempts) == 2
        assert reader_done.wait(10)
    finally:
        engine.dispose()


def _someone_waits(connection) -> bool:
    return connection.execute(text("SELECT count(*) FROM pg_locks WHERE NOT granted")).scalar_one() > 0


class _Deadlock(Exception):
    sqlstate = "40P01"


def test_retrying_gives_up_after_its_tries_and_lets_other_errors_through():
    calls = []

    def always_deadlocked() -> None:
        calls.append(1)
        raise OperationalError("LOCK TABLE runs", {}, _Deadlock())

    with pytest.raises(OperationalError):
        retrying_deadlocks(always_deadlocked)
    assert len(calls) == DEADLOCK_RETRIES + 1

    def locked() -> None:
        calls.append(1)
        raise OperationalError("BEGIN IMMEDIATE", {}, Exception("database is locked"))

    calls.clear()
    with pytest.raises(OperationalError):
        retrying_deadlocks(locked)
    assert len(calls) == 1


def test_the_starts_refresh_runs_under_the_migration_lock_on_sqlite(sqlite_url, tmp_path, monkeypatch):
    """Four servers started together failed one start in CI: the first one's refresh waited for the
    write lock past the busy timeout while the others migrated (no-ops, each holding it)."""
    held = []
    real_refresh = metric_values.refresh

    def refresh(engine, everything=False):
        with open(tmp_path / "packscope.db.migrate-lock", "a+b") as other:
            try:
                fcntl.flock(other.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                held.append(True)
            else:
                fcntl.flock(other.fileno(), fcntl.LOCK_UN)
                held.append(False)
        return real_refresh(engine, everything)

    monkeypatch.setattr(metric_values, "refresh", refresh)
    engine = make_engine(sqlite_url)
    try:
        upgrade_schema(engine)
    finally:
        engine.dispose()
    assert held == [True]
