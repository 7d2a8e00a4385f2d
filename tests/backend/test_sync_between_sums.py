"""The syncs' idle between the traced steps (traced_gaps, sync_idle_between_s; docs/ledger.md)
from a record to every table that keeps the catalogue's SUMS: the interval rows, the rollups
(level 1: blocks of 4 intervals), the run totals and the run's first interval, each against
the sums of the records that carry them (an older agent's records carry neither: they add 0)."""

import random

import pytest
from sqlalchemy import text

from packscope.backend.store.db import make_engine
from packscope.core.catalogue import FLOAT_OPS, SUM

NAMES = ("traced_gaps", "sync_idle_between_s")


def sums_of(rows: list[dict]) -> dict[str, float]:
    """The two sums of `rows`, by the catalogue's own definition (Sum.value, in Python)."""
    return {name: sum(SUM[name].value(row, FLOAT_OPS) for row in rows) for name in NAMES}


def sum_tables(database_url: str, columns: str, rows: str | None = None) -> tuple[list, tuple, tuple, list]:
    """`rows` as the interval rows store them (none where None), and the sums `columns` in the run
    totals, the first interval and the level-1 rollups (each led by its block)."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as connection:
            stored = connection.execute(text(f"SELECT {rows} FROM intervals ORDER BY interval")).all() if rows else []
            totals = connection.execute(text(f"SELECT {columns} FROM run_totals")).one()
            first = connection.execute(text(f"SELECT {columns} FROM run_first_interval")).one()
            blocks = connection.execute(
                text(f"SELECT block, {columns} FROM rollups WHERE level = 1 ORDER BY block")
            ).all()
    finally:
        engine.dispose()
    return stored, tuple(totals), tuple(first), blocks


def test_the_syncs_between_steps_reach_every_sum_table(make_client, database_url, new_run, records):
    client = make_client(database_url)
    assert client.post("/api/v1/runs", json=new_run()).status_code == 201
    rng = random.Random(5)
    recs = records(8)
    for r in recs:
        r.update(traced_steps=3, traced_step_time_s=0.3, traced_busy_s=0.2, sync_idle_s=0.01, launch_idle_s=0.01)
        if r["interval"] % 3:  # intervals 0, 3 and 6 from an agent before the split
            r.update(traced_gaps=rng.randint(0, 2), sync_idle_between_s=rng.uniform(0, 0.02))
    assert client.post("/api/v1/runs/run-1/intervals", json={"intervals": recs}).json()["accepted"] == 8
    rows = [{name: r.get(name) for name in NAMES} for r in recs]
    want = sums_of(rows)  # the catalogue's own sums, in Python
    assert want["traced_gaps"] == sum(r.get("traced_gaps", 0) for r in recs) > 0
    stored, totals, first, blocks = sum_tables(database_url, ", ".join(NAMES), rows=", ".join(NAMES))
    assert [tuple(s) for s in stored] == [(r.get("traced_gaps"), r.get("sync_idle_between_s")) for r in recs]
    assert tuple(totals) == (want["traced_gaps"], pytest.approx(want["sync_idle_between_s"]))
    assert tuple(first) == (0, 0)  # interval 0's agent did not split it: 0, as its sums count it
    for block, *sums in blocks:
        inside = sums_of(rows[4 * block : 4 * block + 4])
        assert sums == [inside["traced_gaps"], pytest.approx(inside["sync_idle_between_s"])], block
    assert [b for b, *_ in blocks] == [0, 1]


BLOCKED = ("blocked_traced_steps", "blocked_traced_gaps", "sync_blocked_s", "sync_blocked_between_s")


def test_the_hosts_blocked_time_reaches_every_sum_table_over_the_rows_that_carry_it(
    make_client, database_url, new_run, records
):
    client = make_client(database_url)
    assert client.post("/api/v1/runs", json=new_run()).status_code == 201
    rng = random.Random(7)
    recs = records(8)
    for r in recs:
        r.update(traced_steps=3, traced_step_time_s=0.3, traced_busy_s=0.2, sync_idle_s=0.01, launch_idle_s=0.01)
        r.update(traced_gaps=2, sync_idle_between_s=0.001)
        if r["interval"] % 3:  # intervals 0, 3 and 6 from an agent before the blocked time
            r.update(sync_blocked_s=rng.uniform(0, 0.05), sync_blocked_between_s=rng.uniform(0, 0.01))
    assert client.post("/api/v1/runs/run-1/intervals", json={"intervals": recs}).json()["accepted"] == 8
    fields = ("traced_steps", "traced_gaps", "sync_blocked_s", "sync_blocked_between_s")
    rows = [{name: r.get(name) for name in fields} for r in recs]

    def want(part: list[dict]) -> list[float]:
        return [sum(SUM[name].value(row, FLOAT_OPS) for row in part) for name in BLOCKED]

    assert want(rows)[0] == 3 * 5  # five rows carry it
    _, totals, first, blocks = sum_tables(database_url, ", ".join(BLOCKED))
    assert list(totals) == pytest.approx(want(rows))
    assert list(first) == [0, 0, 0, 0]  # interval 0's agent did not measure it
    for block, *sums in blocks:
        assert sums == pytest.approx(want(rows[4 * block : 4 * block + 4])), block
    assert [b for b, *_ in blocks] == [0, 1]
