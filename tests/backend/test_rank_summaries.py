"""The rank summaries kept at ingest (backend/store/rank_summaries.py, migration 0016) against a
brute-force computation over the stored interval rows: records in any order, in any batches,
replayed, from two writers at once; and the ranks endpoint that reads them."""

import json
import math
import random
import statistics
import threading
from typing import Any

import pytest
from sqlalchemy import text

from packscope.backend.ingest.batches import ingest_together
from packscope.backend.ingest.rows import parsed_records
from packscope.backend.reads.ranks import MATRIX_CELLS, MATRIX_RANKS
from packscope.backend.store.db import WRITES, make_engine, make_sessionmaker, upgrade_schema
from packscope.backend.store.first_interval import _summed_rows, first_interval_sums
from packscope.backend.store.rank_summaries import BUCKETS_PER_OCTAVE, SLOWEST_KEPT
from tests.backend.migrating import downgrade

RUNS = "/api/v1/runs"
RUN = f"{RUNS}/run-1"
WIDTH = 2 ** (1 / BUCKETS_PER_OCTAVE)  # a bucket's greatest over its least time, at most


def step_times(ranks: int, intervals: int, seed: int) -> dict[tuple[int, int], float]:
    """(interval, rank) -> seconds per step: a spread of times, some exactly equal (ties), a
    straggler now and then, and a rank with no GPU time at all."""
    rng = random.Random(seed)
    times = {}
    for i in range(intervals):
        for r in range(ranks):
            t = rng.choice([0.25, 0.5, rng.uniform(0.2, 0.3), rng.uniform(0.2, 0.3), rng.uniform(0.4, 2.0)])
            times[i, r] = t
    times[0, ranks - 1] = 0.0
    return times


def as_records(records, times: dict[tuple[int, int], float], steps: int = 10) -> list[dict[str, Any]]:
    """One record per (interval, rank) with that step time; `times` becomes each record's GPU time
    ÷ steps (the step time the server sees, which may differ from t·steps/steps in the last bit)."""
    out = []
    for (i, r), t in times.items():
        rec = records(1, start=i, seed=i * 1000 + r, rank=r, gpus=1, steps=steps)[0]
        rec["gpu_time_s"] = t * steps
        times[i, r] = rec["gpu_time_s"] / steps
        out.append(rec)
    return out


def brute_force(engine, run_pk: int) -> dict[str, Any]:
    """Every summary table's rows, computed from the raw interval rows alone."""
    with engine.connect() as connection:
        rows = connection.execute(
            text("SELECT interval, rank, last_step, gpu_time_s, steps FROM intervals WHERE run_pk = :r"), {"r": run_pk}
        ).all()
    by_interval: dict[int, list[tuple[int, int, float]]] = {}
    for interval, rank, last_step, gpu, steps in rows:
        by_interval.setdefault(interval, []).append((rank, last_step, gpu / steps))
    summaries, buckets, slowest = {}, {}, {}
    for i, members in by_interval.items():
        times = [t for _, _, t in members]
        summaries[i] = (len(members), max(s for _, s, _ in members), math.fsum(times), min(times), max(times))
        for t in times:
            b = math.floor(math.log2(t) * BUCKETS_PER_OCTAVE) if t > 0 else -(2**31)
            n, lo, hi = buckets.get((i, b), (0, t, t))
            buckets[i, b] = (n + 1, min(lo, t), max(hi, t))
        slowest[i] = sorted(((r, t) for r, _, t in members), key=lambda rt: (-rt[1], rt[0]))[:SLOWEST_KEPT]
    return {"summaries": summaries, "buckets": buckets, "slowest": slowest, "times": by_interval}


def stored(engine, run_pk: int) -> dict[str, Any]:
    with engine.connect() as connection:
        q = lambda sql: connection.execute(text(sql), {"r": run_pk}).all()  # noqa: E731
        summaries = {
            row[0]: tuple(row[1:])
            for row in q(
                "SELECT interval, reporting_ranks, last_step, step_time_sum, step_time_min, step_time_max"
                " FROM rank_summaries WHERE run_pk = :r"
            )
        }
        buckets = {
            (i, b): (n, lo, hi)
            for i, b, n, lo, hi in q(
                "SELECT interval, bucket, ranks, step_time_min, step_time_max FROM rank_time_buckets WHERE run_pk = :r"
            )
        }
        slowest: dict[int, list[tuple[int, float]]] = {}
        for i, r, t in q("SELECT interval, rank, step_time_s FROM rank_slowest WHERE run_pk = :r"):
            slowest.setdefault(i, []).append((r, t))
    # The reads cut what concurrent writers may leave past the kept number.
    slowest = {i: sorted(v, key=lambda rt: (-rt[1], rt[0]))[:SLOWEST_KEPT] for i, v in slowest.items()}
    return {"summaries": summaries, "buckets": buckets, "slowest": slowest}


def assert_equal(got: dict[str, Any], want: dict[str, Any]) -> None:
    assert got["summaries"].keys() == want["summaries"].keys()
    for i, (n, last_step, total, least, greatest) in want["summaries"].items():
        assert got["summaries"][i][:2] == (n, last_step)
        assert got["summaries"][i][2] == pytest.approx(total, rel=1e-12)  # summed in another order
        assert got["summaries"][i][3:] == (least, greatest)
    assert got["buckets"] == want["buckets"]
    assert got["slowest"] == want["slowest"]


def run_pk_of(engine) -> int:
    with engine.connect() as connection:
        return connection.execute(text("SELECT id FROM runs WHERE run_id = 'run-1'")).scalar_one()


def test_summaries_equal_the_raw_rows_in_any_order_batches_and_replays(make_client, database_url, new_run, records):
    client = make_client(database_url)
    assert client.post(RUNS, json=new_run()).status_code == 201
    recs = as_records(records, step_times(ranks=23, intervals=7, seed=1))
    rng = random.Random(2)
    rng.shuffle(recs)  # intervals and ranks out of order
    replays = rng.sample(recs, 30)
    at = 0
    while at < len(recs):
        size = rng.choice([1, 1, 2, 5, 17])
        batch = recs[at : at + size] + (replays[:2] if at % 3 == 0 else [])  # now and then stored ones again
        client.post(f"{RUN}/intervals", json={"intervals": batch}).raise_for_status()
        at += size
    engine = make_engine(database_url)
    try:
        pk = run_pk_of(engine)
        want = brute_force(engine, pk)
        assert sum(n for n, *_ in want["summaries"].values()) == len(recs)
        assert_equal(stored(engine, pk), want)
    finally:
        engine.dispose()


def test_two_writers_one_record_a_request(database_url, make_client, new_run, records):
    """Two engines (as two server processes, with the app's write options), each storing one
    record per transaction, the records of every interval split between them: the summaries
    equal the raw rows'."""
    client = make_client(database_url)
    assert client.post(RUNS, json=new_run()).status_code == 201
    recs = as_records(records, step_times(ranks=12, intervals=5, seed=3))
    random.Random(4).shuffle(recs)
    halves = recs[0::2] + recs[:6], recs[1::2] + recs[1:7]  # and a few sent by both
    engines = [make_engine(database_url) for _ in halves]
    errors: list[BaseException] = []

    def send(engine, part):
        try:
            for rec in part:
                ingest_together(engine.execution_options(**{WRITES: True}), [("run-1", parsed_records([rec]))])
        except BaseException as exc:  # noqa: BLE001 - reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=send, args=pair) for pair in zip(engines, halves, strict=True)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        pk = run_pk_of(engines[0])
        want = brute_force(engines[0], pk)
        assert sum(n for n, *_ in want["summaries"].values()) == len(recs)
        assert_equal(stored(engines[0], pk), want)
        with make_sessionmaker(engines[0])() as session:  # and the run's first interval, kept one record at a time
            kept, summed = first_interval_sums(session, [pk])[pk], _summed_rows(session, [pk], with_sites=False)[pk]
        assert (kept.rows, kept.first_step, kept.last_step) == (summed.rows, summed.first_step, summed.last_step)
        assert kept.sums == pytest.approx(summed.sums, rel=1e-12)
    finally:
        for engine in engines:
            engine.dispose()


def test_the_endpoint_reads_quantiles_within_a_bucket_of_the_exact_ones(make_client, database_url, new_run, records):
    client = make_client(database_url)
    assert client.post(RUNS, json=new_run()).status_code == 201
    times = step_times(ranks=70, intervals=4, seed=5)
    client.post(f"{RUN}/intervals", json={"intervals": as_records(records, times)}).raise_for_status()
    got = client.get(f"{RUN}/ranks").json()
    assert got["rank_count"] == 70 and got["matrix"] is False and got["ranks"] == [] and got["step_time_s"] == []
    for k, i in enumerate(got["interval"]):
        exact = sorted(times[i, r] for r in range(70))
        order = sorted(range(70), key=lambda r: (-times[i, r], r))
        assert got["reporting_ranks"][k] == 70
        assert got["slowest_rank"][k] == order[0]
        assert got["slowest_ranks"][k] == order[:SLOWEST_KEPT]
        assert got["slowest_ranks_s"][k] == [times[i, r] for r in order[:SLOWEST_KEPT]]
        assert got["slowest_s"][k] == exact[-1] and got["fastest_s"][k] == exact[0]
        assert got["mean_s"][k] == pytest.approx(statistics.fmean(exact), rel=1e-12)
        median = statistics.median(exact)
        assert median / WIDTH <= got["median_s"][k] <= median * WIDTH
        p90 = exact[math.ceil(0.9 * 70) - 1]
        assert p90 / WIDTH <= got["p90_s"][k] <= p90 * WIDTH
        assert got["spread"][k] == pytest.approx(exact[-1] / got["median_s"][k])


def test_the_matrix_comes_for_few_ranks_and_on_demand_capped(make_client, new_run, records):
    client = make_client()
    assert client.post(RUNS, json=new_run()).status_code == 201
    times = step_times(ranks=MATRIX_RANKS + 1, intervals=3, seed=6)
    client.post(f"{RUN}/intervals", json={"intervals": as_records(records, times)}).raise_for_status()
    assert client.get(f"{RUN}/ranks").json()["matrix"] is False
    full = client.get(f"{RUN}/ranks", params={"matrix": "true"}).json()
    assert full["matrix"] is True and full["ranks"] == list(range(MATRIX_RANKS + 1))
    assert full["step_time_s"][5] == [times[i, 5] for i in range(3)]
    assert client.get(f"{RUN}/ranks", params={"matrix": "false", "step_max": 10}).json()["step_time_s"] == []
    # Past MATRIX_CELLS cells, fewer intervals (always at least the latest one).
    assert len(full["interval"]) * len(full["ranks"]) <= max(MATRIX_CELLS, len(full["ranks"]))


def test_the_answer_does_not_grow_with_the_ranks(make_client, tmp_path, new_run, records):
    """Past MATRIX_RANKS the answer holds a fixed number of values per interval: its size at 300
    ranks is that at 80 (to the digits of the numbers), and 200 intervals stay far below 200 KB."""
    sizes = {}
    for ranks in (80, 300):
        client = make_client(f"sqlite:///{tmp_path / f'r{ranks}.db'}")
        assert client.post(RUNS, json=new_run()).status_code == 201
        recs = as_records(records, step_times(ranks, 4, seed=7))
        for at in range(0, len(recs), 200):
            client.post(f"{RUN}/intervals", json={"intervals": recs[at : at + 200]}).raise_for_status()
        body = client.get(f"{RUN}/ranks").content
        assert len(json.loads(body)["interval"]) == 4
        sizes[ranks] = len(body)
    assert sizes[300] <= sizes[80] * 1.1
    assert sizes[300] / 4 * 200 < 200_000


def test_migration_0016_backfills_stored_rows_as_ingest_keeps_them(make_client, database_url, new_run, records):
    client = make_client(database_url)
    assert client.post(RUNS, json=new_run()).status_code == 201
    recs = as_records(records, step_times(ranks=11, intervals=5, seed=8))
    random.Random(9).shuffle(recs)
    client.post(f"{RUN}/intervals", json={"intervals": recs}).raise_for_status()
    before = client.get(f"{RUN}/ranks").json()
    engine = make_engine(database_url)
    try:
        pk = run_pk_of(engine)
        kept = stored(engine, pk)
        downgrade(engine, "0014")
        upgrade_schema(engine)
        backfilled = stored(engine, pk)
        assert_equal(backfilled, brute_force(engine, pk))
        assert backfilled["buckets"] == kept["buckets"] and backfilled["slowest"] == kept["slowest"]
    finally:
        engine.dispose()
    after = make_client(database_url).get(f"{RUN}/ranks").json()
    assert after.keys() == before.keys()
    for key in after:
        assert after[key] == (pytest.approx(before[key]) if key == "mean_s" else before[key])


def test_the_run_summary_counts_the_ranks_of_the_first_interval(client, new_run, records):
    """RunSummary.ranks (the run page asks for the ranks panel only where it is 2 or more)."""
    assert client.post(RUNS, json=new_run()).status_code == 201
    assert client.get(RUN).json()["ranks"] is None
    client.post(f"{RUN}/intervals", json={"intervals": records(3, rank=0, gpus=1)}).raise_for_status()
    assert client.get(RUN).json()["ranks"] == 1
    late = [r for rank in (1, 2) for r in records(2, seed=rank, rank=rank, gpus=1)]
    client.post(f"{RUN}/intervals", json={"intervals": late}).raise_for_status()
    assert client.get(RUN).json()["ranks"] == 3
