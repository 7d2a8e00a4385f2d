"""The length histograms summed per interval at ingest (store/histogram_sums.py, migration 0016)
against the records' own histograms summed here: records of many ranks in any order, replayed;
the heatmap's columns and the bar view read them; the migration sums stored rows alike."""

import random

from packscope.backend.store.db import make_engine, upgrade_schema
from packscope.core.histograms import KINDS, NUM_BUCKETS
from tests.backend.migrating import downgrade

RUNS = "/api/v1/runs"
RUN = f"{RUNS}/run-1"


def summed(recs, interval):
    mine = [r for r in recs if r["interval"] == interval]
    return {
        kind: {part: [sum(r["histograms"][kind][part][b] for r in mine) for b in range(NUM_BUCKETS)]
               for part in ("count", "tokens")}
        for kind in KINDS
    }  # fmt: skip


def posted(client, new_run, records):
    assert client.post(RUNS, json=new_run()).status_code == 201
    recs = [r for rank in range(6) for r in records(5, seed=rank, rank=rank, gpus=1)]
    random.Random(3).shuffle(recs)
    for at in range(0, len(recs), 7):
        client.post(f"{RUN}/intervals", json={"intervals": recs[at : at + 7] + recs[:3]}).raise_for_status()
    return recs


def check(client, recs):
    columns = client.get(f"{RUN}/histograms/over-time", params={"columns": 200}).json()
    assert columns["intervals"] == [0, 1, 2, 3, 4]
    for k, i in enumerate(columns["intervals"]):
        want = summed(recs, i)
        for kind in KINDS:
            for part in ("count", "tokens"):
                assert columns[kind][part][k] == want[kind][part]
        assert columns["first_step"][k] == min(r["first_step"] for r in recs if r["interval"] == i)
    bars = client.get(f"{RUN}/histograms", params={"interval": 2}).json()
    assert {kind: bars[kind] for kind in KINDS} == summed(recs, 2)


def test_the_sums_equal_the_records_in_any_order_and_replayed(make_client, database_url, new_run, records):
    client = make_client(database_url)
    check(client, posted(client, new_run, records))


def test_migration_0016_sums_stored_rows(make_client, database_url, new_run, records):
    client = make_client(database_url)
    recs = posted(client, new_run, records)
    engine = make_engine(database_url)
    try:
        downgrade(engine, "0014")
        upgrade_schema(engine)
    finally:
        engine.dispose()
    check(make_client(database_url), recs)
