"""The series' two ways of merging a range's tiles into chart buckets (backend/reads/series.py): by the
database, one row per bucket, where every part of the range holds rows (_grouped_read), and here
from every tile's row (_per_tile_read), where a part holds none or PostgreSQL's float8 sum
overflows. Both must draw the same chart; each is checked to be the one that answered."""

import math
import random
from typing import Any

import numpy as np
import pytest

from packscope.backend.reads import series as series_module

RUNS = "/api/v1/runs"


@pytest.fixture
def client(database_url, make_client):
    return make_client(database_url)


@pytest.fixture
def per_tile_calls(monkeypatch):
    """How many series were merged here, tile by tile, rather than by the database."""
    calls = []
    real = series_module._per_tile_read

    def counted(*args: Any, **kwargs: Any) -> Any:
        calls.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(series_module, "_per_tile_read", counted)
    return calls


def post(client, run_id, recs):
    for at in range(0, len(recs), 64):
        response = client.post(f"{RUNS}/{run_id}/intervals", json={"intervals": recs[at : at + 64]})
        assert response.status_code == 200, response.text


def get_series(client, run_id, params):
    response = client.get(f"{RUNS}/{run_id}/series", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def assert_close_lists(got: list[Any], want: list[Any], name: str) -> None:
    assert [v is None for v in got] == [v is None for v in want], name
    for x, y in zip(got, want, strict=True):
        if x is not None:
            assert x == pytest.approx(y, rel=1e-12, abs=0.0) or (math.isinf(x) and x == y), name


def assert_same_chart(a: dict[str, Any], b: dict[str, Any]) -> None:
    """Equal points, steps, bands and wall-clock extents (picked, never computed); sums, rates and
    channel losses equal up to the order of float additions; channel tokens (integers) equal."""
    assert a["points"] == b["points"] and a["wall_origin"] == b["wall_origin"]
    assert a["columns"].keys() == b["columns"].keys()
    for name, values in a["columns"].items():
        if name in ("step", "first_step", "last_step") or name.endswith(("_min", "_max")):
            assert values == b["columns"][name], name
        else:
            assert_close_lists(values, b["columns"][name], name)
    assert a["channel_loss"].keys() == b["channel_loss"].keys()
    for channel, losses in a["channel_loss"].items():
        assert_close_lists(losses, b["channel_loss"][channel], channel)
    assert a["channel_tokens"] == b["channel_tokens"]  # integer counts: exact sums


def per_tile(monkeypatch, client, run_id, params):
    """The same series merged tile by tile (the database's merge switched off)."""
    with monkeypatch.context() as patch:
        patch.setattr(series_module, "_grouped_read", lambda *args: None)
        return get_series(client, run_id, params)


def test_the_databases_merge_draws_what_the_per_tile_merge_draws(client, new_run, records, per_tile_calls, monkeypatch):
    """A run without gaps, 3 ranks, per-channel losses, ranges of at least 4·max_points intervals
    (so the chart reads stored levels, with level-0 and finer tiles at cut ends): the database
    merges every one."""
    assert client.post(RUNS, json=new_run("even")).status_code == 201
    recs = [r for rank in range(3) for r in records(700, start=5, seed=rank, gpus=2, rank=rank)]
    rng = random.Random(1)
    for r in recs:
        channels = rng.sample(["code", "web", "math"], rng.randint(1, 3))
        r["channel_loss"] = {c: rng.uniform(1.0, 4.0) for c in channels}
        r["channel_tokens"] = {c: rng.randint(1, r["real_tokens"]) for c in channels}
    rng.shuffle(recs)
    post(client, "even", recs)
    checked = 0
    for _ in range(12):
        max_points = rng.randint(1, 60)
        first = rng.randint(5, 400)
        last = rng.randint(first + 4 * max_points, 704)
        params = {"max_points": max_points, "step_min": first * 10 + rng.randint(1, 10), "step_max": last * 10 + 1}
        grouped = get_series(client, "even", params)
        assert per_tile_calls == [], params
        assert_same_chart(grouped, per_tile(monkeypatch, client, "even", params))
        per_tile_calls.clear()  # per_tile's own
        assert 0 < grouped["points"] <= max_points
        checked += 1
    whole = get_series(client, "even", {"max_points": 100})
    assert whole["points"] == 100 and per_tile_calls == []
    # every record in one bucket; each step once (rank 0's)
    assert sum(whole["columns"]["steps"]) == sum(r["steps"] for r in recs if r["rank"] == 0)
    assert sum(sum(n) for n in whole["channel_tokens"].values()) == sum(sum(r["channel_tokens"].values()) for r in recs)
    assert checked == 12


@pytest.mark.parametrize(("gap", "step_max"), [((100, 300), 7000), ((650, 690), 7000), ((600, 640), 6200)])
def test_a_range_with_parts_that_hold_no_rows_is_merged_per_tile(
    client, new_run, records, per_tile_calls, monkeypatch, gap, step_max
):
    """Intervals missing inside the range, or at its end (a step_max inside the gap ends the range
    at the interval before the next stored one): the buckets are dealt over the parts that hold
    rows, as before, so the database's merge (which assumes none is empty) steps aside."""
    assert client.post(RUNS, json=new_run("gappy")).status_code == 201
    recs = [r for r in records(700, seed=3) if not gap[0] <= r["interval"] < gap[1]]
    post(client, "gappy", recs)
    params = {"max_points": 50, "step_min": 1, "step_max": step_max}
    answer = get_series(client, "gappy", params)
    assert len(per_tile_calls) == 1
    shown = [r for r in recs if r["first_step"] <= step_max]
    assert sum(answer["columns"]["steps"]) == sum(r["steps"] for r in shown)  # each record in one bucket
    assert answer["points"] <= 50
    assert_same_chart(answer, per_tile(monkeypatch, client, "gappy", params))


@pytest.mark.postgres
def test_postgresql_sums_that_overflow_float8_are_merged_per_tile(
    make_client, postgres, new_run, records, per_tile_calls
):
    """Two level-1 blocks whose Σ loss·tokens are each finite (1e300 · 1e8) but whose sum is not:
    PostgreSQL's float8 addition raises there, where IEEE doubles give inf; the chart is then
    merged tile by tile (inf: no loss to show) and the request still answers."""
    client = make_client(postgres)
    assert client.post(RUNS, json=new_run("huge")).status_code == 201
    recs = records(16, seed=4)
    for r in (recs[0], recs[4]):  # blocks 0 and 1 of level 1, one bucket at max_points=2
        r.update(loss=1e300, tokens=10**8, real_tokens=10**8)
    post(client, "huge", recs)
    answer = get_series(client, "huge", {"max_points": 2})
    assert len(per_tile_calls) == 1
    assert answer["points"] == 2
    assert answer["columns"]["loss"][0] is None  # inf / tokens: not a number to draw
    assert answer["columns"]["loss"][1] == pytest.approx(
        sum(r["loss"] * r["real_tokens"] for r in recs[8:]) / sum(r["real_tokens"] for r in recs[8:])
    )


def test_the_bucket_formula_is_the_dealing_rule():
    """_Buckets puts the part of rank r in bucket ((r + 1)·points - 1) // count, the SQL's formula;
    the rule it inverts: bucket b starts at the part of rank b·count // points."""
    for count in range(1, 200):
        for max_points in (1, 2, 3, count // 3 + 1, count - 1 or 1, count, count + 5):
            points = min(count, max_points)
            starts = np.arange(points) * count // points
            ranks = np.arange(count)
            dealt = np.searchsorted(starts, ranks, side="right") - 1
            parts = np.arange(count) + 7
            buckets = series_module._Buckets(parts, 0, max_points)
            assert buckets.of(np.zeros(count, np.int64), parts).tolist() == dealt.tolist(), (count, max_points)
            assert buckets.of(np.zeros(2, np.int64), np.array([6, count + 7])).tolist() == [-1, -1]
