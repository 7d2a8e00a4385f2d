"""The run's first interval kept at ingest (run_first_interval, store/aggregates.py) against the
sums of its rows read back (store/first_interval.py's _summed_rows): records in any order (a
lower interval arriving after higher ones), the first interval's ranks split over batches,
replays; and the row migration 0016 marks for runs stored before it."""

import random

import pytest
from sqlalchemy import text

from packscope.backend.store.db import make_engine, make_sessionmaker, upgrade_schema
from packscope.backend.store.first_interval import _summed_rows, first_interval_sums
from packscope.core.catalogue import SUM_NAMES
from tests.backend.migrating import downgrade

RUNS = "/api/v1/runs"
RUN = f"{RUNS}/run-1"


def kept_and_summed(database_url):
    engine = make_engine(database_url)
    try:
        with make_sessionmaker(engine)() as session:
            pk = session.execute(text("SELECT id FROM runs WHERE run_id = 'run-1'")).scalar_one()
            marked = session.execute(text("SELECT rows FROM run_first_interval WHERE run_pk = :p"), {"p": pk}).all()
            return first_interval_sums(session, [pk])[pk], _summed_rows(session, [pk], with_sites=False)[pk], marked
    finally:
        engine.dispose()


def assert_same(kept, summed):
    assert (kept.rows, kept.first_step, kept.last_step) == (summed.rows, summed.first_step, summed.last_step)
    for name in SUM_NAMES:
        assert kept.sums[name] == pytest.approx(summed.sums[name], rel=1e-12, abs=1e-300), name


def test_the_kept_first_interval_equals_its_rows_in_any_order(make_client, database_url, new_run, records):
    client = make_client(database_url)
    assert client.post(RUNS, json=new_run()).status_code == 201
    recs = [r for rank in range(5) for r in records(6, start=3, seed=rank, rank=rank, gpus=1)]
    recs += [r for rank in (0, 2, 4) for r in records(1, start=1, seed=10 + rank, rank=rank, gpus=1)]
    random.Random(1).shuffle(recs)
    lowest_at = [k for k, r in enumerate(recs) if r["interval"] == 1]
    assert lowest_at[0] > 0  # some higher interval is stored before the lowest one arrives
    for at in range(0, len(recs), 4):
        client.post(f"{RUN}/intervals", json={"intervals": recs[at : at + 4] + recs[:2]}).raise_for_status()
    kept, summed, marked = kept_and_summed(database_url)
    assert kept.rows == 3 and marked == [(3,)]
    assert_same(kept, summed)
    # And the steady rates that read it are those of the rows.
    steady = client.get(RUN).json()["steady"]
    later = [r for r in recs if r["interval"] > 1]
    assert steady["step_time_s"] == pytest.approx(
        sum(r["gpu_time_s"] for r in later) / sum(r["steps"] for r in later), rel=1e-9
    )


def test_a_run_stored_before_0016_is_marked_and_summed_from_its_rows(make_client, database_url, new_run, records):
    client = make_client(database_url)
    assert client.post(RUNS, json=new_run()).status_code == 201
    recs = [r for rank in range(3) for r in records(4, start=2, seed=rank, rank=rank, gpus=1)]
    client.post(f"{RUN}/intervals", json={"intervals": recs}).raise_for_status()
    before = client.get(RUN).json()["steady"]
    engine = make_engine(database_url)
    try:
        downgrade(engine, "0014")
        upgrade_schema(engine)
    finally:
        engine.dispose()
    kept, summed, marked = kept_and_summed(database_url)
    assert marked == [(-1,)]  # the marked row: the reads sum the rows
    assert_same(kept, summed)
    client = make_client(database_url)
    assert client.get(RUN).json()["steady"] == pytest.approx(before)
    # A later interval leaves the mark; a lower one replaces it with that interval's own sums.
    client.post(f"{RUN}/intervals", json={"intervals": records(1, start=9, rank=0, gpus=1)}).raise_for_status()
    assert kept_and_summed(database_url)[2] == [(-1,)]
    client.post(f"{RUN}/intervals", json={"intervals": records(1, start=0, rank=1, gpus=1)}).raise_for_status()
    kept, summed, marked = kept_and_summed(database_url)
    assert marked == [(1,)] and kept.rows == 1
    assert_same(kept, summed)
