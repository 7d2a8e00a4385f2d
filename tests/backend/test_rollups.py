"""The rollups kept at ingest: charts and totals read from them must equal a brute-force
computation over the raw records (conftest's oracle, which does not use the catalogue's code)."""

import random

import pytest
from sqlalchemy import event, func, select
from sqlalchemy.orm import Session

from packscope.backend.reads import series
from packscope.backend.store.models import STORED_LEVELS, Run, rollups, run_totals

RUNS = "/api/v1/runs"


@pytest.fixture
def any_client(database_url, make_client):
    return make_client(database_url)


def post_all(client, run_id, recs, rng, batch=64):
    """Post `recs` in batches of random size (at most `batch`), in order."""
    at = 0
    while at < len(recs):
        size = rng.randint(1, batch)
        response = client.post(f"{RUNS}/{run_id}/intervals", json={"intervals": recs[at : at + size]})
        assert response.status_code == 200, response.text
        at += size


def in_range(recs, step_min, step_max):
    return [
        r
        for r in recs
        if (step_min is None or r["last_step"] >= step_min) and (step_max is None or r["first_step"] <= step_max)
    ]


def check_series(client, run_id, recs, oracle, close, max_points, step_min=None, step_max=None, points=None):
    params = {"max_points": max_points}
    params.update({k: v for k, v in (("step_min", step_min), ("step_max", step_max)) if v is not None})
    answer = client.get(f"{RUNS}/{run_id}/series", params=params).json()
    cols = answer["columns"]
    assert answer["wall_origin"] == min(r["wall_start"] for r in recs)  # the run's start, whatever the range
    want_rows = in_range(recs, step_min, step_max)
    intervals = sorted({r["interval"] for r in want_rows})
    assert len(cols["step"]) == (min(len(intervals), max_points) if points is None else points)
    covered = []
    for i, (first, last) in enumerate(zip(cols["first_step"], cols["last_step"], strict=True)):
        bucket = [r for r in want_rows if first <= r["first_step"] and r["last_step"] <= last]
        assert bucket and min(r["first_step"] for r in bucket) == first and max(r["last_step"] for r in bucket) == last
        covered += bucket
        got = {name: values[i] for name, values in cols.items()}
        close(
            got,
            oracle(bucket),
            [
                "steps",
                "tokens",
                "real_tokens",
                "tflops_bshd",
                "tflops_bshd_min",
                "tflops_bshd_max",
                "tflops_thd",
                "tflops_thd_min",
                "tflops_thd_max",
                "tflops_useful",
                "tflops_useful_min",
                "tflops_useful_max",
                "overcount_pct",
                "mfu_thd",
                "step_time_s",
                "step_time_s_min",
                "step_time_s_max",
                "tokens_per_gpu_s",
                "syncs_per_iter",
                "loss",
                "padding_pct",
            ],
        )
        # The wall-clock extent of the bucket: the time x axes draw it at its end.
        assert cols["wall_start_min"][i] == min(r["wall_start"] for r in bucket)
        assert cols["wall_end_max"][i] == max(r["wall_end"] for r in bucket)
    key = lambda r: (r["interval"], r["rank"])  # noqa: E731
    assert sorted(covered, key=key) == sorted(want_rows, key=key)  # each row in exactly one bucket


@pytest.mark.parametrize("seed", [1, 2])
def test_series_from_rollups_equal_brute_force(any_client, new_run, records, oracle, close, seed):
    rng = random.Random(seed)
    run_id = f"random-{seed}"
    assert any_client.post(RUNS, json=new_run(run_id)).status_code == 201
    start = rng.randint(0, 100)
    recs = records(rng.randint(150, 400), start=start, seed=seed)
    post_all(any_client, run_id, recs, rng)
    first, last = recs[0]["first_step"], recs[-1]["last_step"]
    for _ in range(6):
        step_min = rng.choice([None, rng.randint(first - 20, last)])
        step_max = rng.choice([None, rng.randint(step_min or first, last + 20)])
        check_series(any_client, run_id, recs, oracle, close, rng.randint(1, 120), step_min, step_max)
    check_series(any_client, run_id, recs, oracle, close, 1)
    check_series(any_client, run_id, recs, oracle, close, 10_000)


def test_multi_rank_run(any_client, new_run, records, oracle, close):
    assert any_client.post(RUNS, json=new_run("ranks")).status_code == 201
    rng = random.Random(3)
    recs = [r for rank in range(3) for r in records(90, seed=10 + rank, gpus=4, rank=rank)]
    rng.shuffle(recs)  # ranks arrive interleaved and out of order
    post_all(any_client, "ranks", recs, rng)
    recs.sort(key=lambda r: (r["interval"], r["rank"]))
    for max_points, step_min, step_max in [(7, None, None), (90, None, None), (5, 155, 633), (1, 1, 900)]:
        check_series(any_client, "ranks", recs, oracle, close, max_points, step_min, step_max)
    run = any_client.get(f"{RUNS}/ranks").json()
    assert (run["records"], run["last_step"]) == (270, 900)
    close(run["totals"], oracle(recs), ["steps", "tokens", "tflops_thd", "overcount_pct", "loss", "syncs_per_iter"])


@pytest.mark.parametrize(("ranks", "points"), [(2, 10), (3, 8), (8, 8)])
def test_level_0_groups_the_ranks_of_each_interval(any_client, new_run, records, oracle, close, ranks, points):
    """Level 0 is not stored: a range of fewer than 4·max_points intervals is grouped from the
    interval rows, each interval merged over its ranks, up to 8 rows per point; past that (more
    ranks) it is drawn from level-1 blocks, exact still, with fewer points (30 intervals: 8 blocks
    of 4, the last cut short)."""
    assert any_client.post(RUNS, json=new_run("wide")).status_code == 201
    rng = random.Random(ranks)
    recs = [r for rank in range(ranks) for r in records(30, seed=rank, gpus=2, rank=rank)]
    rng.shuffle(recs)
    post_all(any_client, "wide", recs, rng)
    recs.sort(key=lambda r: (r["interval"], r["rank"]))
    check_series(any_client, "wide", recs, oracle, close, 10, points=points)
    check_series(any_client, "wide", recs, oracle, close, 100)  # one bucket per interval
    check_series(any_client, "wide", recs, oracle, close, 3, step_min=45, step_max=251)  # level-0 edges


def test_the_row_count_that_picks_level_0_is_the_interval_rows(any_client, new_run, records):
    """Whether a range holds more interval rows than level 0 may group (series._more_rows_than),
    counted from the rollups' blocks and the level-0 edges, against a count of the interval rows:
    ranks that sent some intervals only, a gap, ranges that start and end anywhere."""
    assert any_client.post(RUNS, json=new_run("counted")).status_code == 201
    recs = [r for rank in range(3) for r in records(70 - 20 * rank, seed=rank, gpus=2, rank=rank)]
    recs += records(25, start=90, seed=9, gpus=2)  # intervals 70..89 sent by no rank
    post_all(any_client, "counted", recs, random.Random(4))
    rng = random.Random(5)
    spans = [(0, 114), (0, 0), (3, 3), (69, 90), (70, 89), (16, 79), (1, 114)]
    spans += [(a, a + rng.randrange(40)) for a in (rng.randrange(115) for _ in range(40))]
    with Session(any_client.app.state.engine) as session:
        run = session.scalars(select(Run).where(Run.run_id == "counted")).one()
        for first, last in spans:
            rows = sum(first <= r["interval"] <= last for r in recs)
            for limit in {0, rows - 1, rows, rows + 1, rng.randrange(200)} - {-1}:
                assert series._more_rows_than(session, run, first, last, limit) == (rows > limit), (first, last, limit)


def test_a_wide_run_counts_its_rows_from_the_blocks_alone(any_client, new_run, records, monkeypatch):
    """Where the rollup blocks of a range hold more rows than level 0 may group (many ranks), the
    series reads no interval row to know it: a LIMIT count of them grew with the ranks (and on
    PostgreSQL, under a bitmap scan, read every index entry of the run)."""
    assert any_client.post(RUNS, json=new_run("wide")).status_code == 201
    recs = [r for rank in range(9) for r in records(64, seed=rank, gpus=2, rank=rank)]
    post_all(any_client, "wide", recs, random.Random(6))
    issued: list[str] = []
    engine = any_client.app.state.engine
    listen = lambda *args: issued.append(args[2])  # noqa: E731
    event.listen(engine, "before_cursor_execute", listen)
    try:
        answer = any_client.get(f"{RUNS}/wide/series", params={"max_points": 70}).json()
    finally:
        event.remove(engine, "before_cursor_execute", listen)
    assert answer["points"] == 16  # 576 rows > 8 a point: level-1 blocks
    counts = [sql for sql in issued if "count(" in sql.lower() and "FROM intervals" in sql and "LIMIT" in sql]
    assert issued and not counts  # (the app's other statements, alert rounds, count no LIMIT)


def stored_rollup_sums(client, run_pk=1):
    """Per level: (Σ rows, Σ steps, Σ tokens) over the stored rollup blocks of the run."""
    with client.app.state.engine.connect() as connection:
        query = (
            select(rollups.c.level, func.sum(rollups.c.rows), func.sum(rollups.c.steps), func.sum(rollups.c.tokens))
            .where(rollups.c.run_pk == run_pk)
            .group_by(rollups.c.level)
        )
        return {level: (int(n), int(steps), int(tokens)) for level, n, steps, tokens in connection.execute(query)}


def test_duplicates_never_double_count(any_client, new_run, records, oracle, close):
    assert any_client.post(RUNS, json=new_run()).status_code == 201
    recs = records(40, seed=5)
    batch = f"{RUNS}/run-1/intervals"
    first = any_client.post(batch, json={"intervals": recs[:25] + recs[3:9]}).json()  # repeats inside
    assert first == {"accepted": 25, "duplicates": 6}
    replay = [dict(r, tokens=r["tokens"] * 2, steps=r["steps"]) for r in recs]  # changed numbers, same keys
    assert any_client.post(batch, json={"intervals": replay}).json() == {"accepted": 15, "duplicates": 25}
    assert any_client.post(batch, json={"intervals": replay}).json() == {"accepted": 0, "duplicates": 40}
    stored = recs[:25] + replay[25:]

    want = (len(stored), sum(r["steps"] for r in stored), sum(r["tokens"] for r in stored))
    assert stored_rollup_sums(any_client) == dict.fromkeys(STORED_LEVELS, want)  # level 0: the intervals
    check_series(any_client, "run-1", stored, oracle, close, 1)
    check_series(any_client, "run-1", stored, oracle, close, 40)
    sites = any_client.get(f"{RUNS}/run-1/sync-sites").json()
    assert sum(s["count"] for s in sites["sites"]) == sum(r["syncs"]["total"] for r in stored)


def test_run_totals_equal_sums_over_rows(any_client, new_run, records, oracle, close):
    assert any_client.post(RUNS, json=new_run()).status_code == 201
    recs = records(123, seed=9)
    recs[5]["gpu"] = {"util_pct": 80.0, "power_w": 500.0, "energy_j": 900.0}
    recs[6]["loss"] = None
    post_all(any_client, "run-1", recs, random.Random(9))
    with any_client.app.state.engine.connect() as connection:
        totals = connection.execute(select(run_totals)).one()._mapping
    assert (totals["rows"], totals["last_interval"], totals["last_step"]) == (123, 122, 1230)
    for name in ("steps", "tokens", "real_tokens", "packs", "documents", "seqlen_sq_sum_thd"):
        assert totals[name] == sum(r[name] for r in recs), name
    assert totals["syncs_total"] == sum(r["syncs"]["total"] for r in recs)
    assert totals["loss_tokens"] == sum(r["real_tokens"] for r in recs if r["loss"] is not None)
    assert totals["gpu_power_x_s"] == pytest.approx(500.0 * recs[5]["host_time_s"])
    assert totals["energy_tokens"] == recs[5]["real_tokens"]
    run = any_client.get(f"{RUNS}/run-1").json()
    with_loss = [r for r in recs if r["loss"] is not None]
    close(run["totals"], oracle(with_loss), ["loss"])  # a missing loss weighs nothing
    filled = [dict(r, loss=r["loss"] or 0.0) for r in recs]  # the oracle wants a loss everywhere
    close(
        run["totals"], oracle(filled), ["steps", "tokens", "tflops_useful", "mfu_bshd", "padding_pct", "syncs_per_iter"]
    )


def test_stored_blocks_equal_brute_force_across_level_boundaries(any_client, new_run, records, oracle, close):
    """Batches that straddle the boundaries of every level up to 4^6 (and ranks out of order):
    every stored block of every level holds exactly its intervals' rows, and a block merged once
    for all coarser levels of a batch gets each level's own index."""
    assert any_client.post(RUNS, json=new_run("edges")).status_code == 201
    start = 4**6 - 70
    recs = [r for rank in range(2) for r in records(140, start=start, seed=rank, gpus=2, rank=rank)]
    rng = random.Random(6)
    rng.shuffle(recs)
    post_all(any_client, "edges", recs, rng)
    recs.sort(key=lambda r: (r["interval"], r["rank"]))
    columns = (rollups.c.level, rollups.c.block, rollups.c.rows, rollups.c.tokens, rollups.c.first_step)
    with any_client.app.state.engine.connect() as connection:
        stored = {
            (level, block): (n, tokens, first)
            for level, block, n, tokens, first in connection.execute(select(*columns).where(rollups.c.run_pk == 1))
        }
    want: dict[tuple[int, int], tuple[int, int, int]] = {}
    for level in STORED_LEVELS:
        for r in recs:
            key = (level, r["interval"] >> 2 * level)
            n, tokens, first = want.get(key, (0, 0, r["first_step"]))
            want[key] = (n + 1, tokens + r["tokens"], min(first, r["first_step"]))
    assert stored == want
    for max_points, step_min, step_max in [(1, None, None), (9, None, None), (33, 40300, 40800), (200, None, None)]:
        check_series(any_client, "edges", recs, oracle, close, max_points, step_min, step_max)


@pytest.mark.postgres
def test_postgresql_adds_a_batchs_aggregates_in_one_statement(make_client, postgres, new_run, records, monkeypatch):
    """Rollups, channel rollups, run totals and sync sites: one round trip for all four tables."""
    from packscope.backend.store import writes

    client = make_client(postgres)
    assert client.post(RUNS, json=new_run()).status_code == 201
    statements: list[str] = []
    run_sql = writes.run_sql

    def recording(connection, sql, *args, **kwargs):
        statements.append(sql)
        return run_sql(connection, sql, *args, **kwargs)

    monkeypatch.setattr(writes, "run_sql", recording)
    recs = records(8)
    for r in recs:
        r["channel_loss"], r["channel_tokens"] = {"code": 2.0}, {"code": 10}
    answer = client.post(f"{RUNS}/run-1/intervals", json={"intervals": recs})
    assert answer.json() == {"accepted": 8, "duplicates": 0}
    adding = [s for s in statements if "ON CONFLICT" in s and "DO UPDATE" in s]
    assert len(adding) == 1, adding
    for table in ("rollups", "channel_rollups", "run_totals", "run_sync_sites"):
        assert f"INSERT INTO {table} " in adding[0]
    with client.app.state.engine.connect() as connection:
        assert connection.execute(select(run_totals.c.rows)).scalar_one() == 8
        assert connection.execute(select(func.count()).select_from(rollups)).scalar_one() > len(STORED_LEVELS)
    assert client.get(f"{RUNS}/run-1/series").json()["channel_tokens"]["code"] == [10] * 8
