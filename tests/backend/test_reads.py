"""The read API: every number is checked against an independent computation from the raw records."""

import csv
import io
import itertools
import statistics

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packscope.backend.reads import csv_export
from packscope.backend.reads.stats import mann_whitney_u

RUNS = "/api/v1/runs"
RUN = f"{RUNS}/run-1"

DOCUMENTED_CSV_COLUMNS = [
    "interval",
    "rank",
    "first_step",
    "last_step",
    "steps",
    "gpus",
    "wall_start",
    "wall_end",
    "gpu_time_s",
    "host_time_s",
    "step_time_p50_s",
    "step_time_p90_s",
    "step_time_max_s",
    "timing_lag_steps",
    "tokens",
    "real_tokens",
    "packs",
    "documents",
    "seqlen_sq_sum_bshd",
    "seqlen_sq_sum_thd",
    "flops_bshd",
    "flops_thd",
    "flops_useful",
    "loss",
    "lr",
    "grad_norm",
    "tflops_bshd",
    "tflops_thd",
    "tflops_useful",
    "mfu_bshd",
    "mfu_thd",
    "mfu_useful",
    "overcount_pct",
    "tokens_per_gpu_s",
    "padding_pct",
]


@pytest.fixture
def any_client(database_url, make_client, new_run):
    """A client with run-1 stored, once on SQLite and once on PostgreSQL."""
    client = make_client(database_url)
    assert client.post(RUNS, json=new_run()).status_code == 201
    return client


@pytest.fixture
def thousand(any_client, records):
    recs = records(1000, seed=7)
    assert any_client.post(f"{RUN}/intervals", json={"intervals": recs}).json()["accepted"] == 1000
    return recs


def test_series_buckets_match_an_independent_computation(any_client, thousand, oracle, close):
    series = any_client.get(f"{RUN}/series", params={"max_points": 50}).json()
    cols = series["columns"]
    assert 0 < series["points"] <= 50 and series["points"] == len(cols["step"])

    by_last_step = {r["last_step"]: r for r in thousand}
    covered = []
    for i in range(series["points"]):
        # A bucket is a run of consecutive intervals from first_step to last_step.
        first, last = cols["first_step"][i], cols["last_step"][i]
        bucket = [r for r in thousand if first <= r["first_step"] and r["last_step"] <= last]
        assert bucket[0]["first_step"] == cols["first_step"][i]
        assert bucket[-1]["last_step"] == cols["last_step"][i] == cols["step"][i]
        assert cols["last_step"][i] in by_last_step
        covered += bucket
        want = oracle(bucket)
        got = {name: values[i] for name, values in cols.items()}
        close(
            got,
            want,
            [
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
        # the band really is a band, and the ratio of sums is not the mean of ratios
        assert got["tflops_thd_min"] <= got["tflops_thd"] <= got["tflops_thd_max"]
        mean_of_rates = sum(oracle([r])["tflops_thd"] for r in bucket) / len(bucket)
        assert got["tflops_thd"] != pytest.approx(mean_of_rates, rel=1e-6)
    assert covered == thousand  # every interval in exactly one bucket, in order


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(n=st.integers(1, 60), max_points=st.integers(1, 70))
def test_buckets_are_consecutive_and_cover_every_interval(client, new_run, records, n, max_points):
    run_id = f"h-{n}-{max_points}"
    if client.post(RUNS, json=new_run(run_id)).status_code == 201:
        client.post(f"{RUNS}/{run_id}/intervals", json={"intervals": records(n)})
    cols = client.get(f"{RUNS}/{run_id}/series", params={"max_points": max_points}).json()["columns"]
    assert len(cols["step"]) == min(n, max_points)
    assert cols["first_step"][0] == 1 and cols["last_step"][-1] == 10 * n
    assert all(b == a + 1 for a, b in zip(cols["last_step"], cols["first_step"][1:], strict=False))
    # Buckets are whole aligned blocks of 4^k intervals (docs/api.md): every inner boundary is a
    # multiple of one block size, and bucket sizes differ by at most one block.
    starts = [(first - 1) // 10 for first in cols["first_step"]]
    block = max(4**k for k in range(6) if all(s % 4**k == 0 for s in starts))
    sizes = [(last - first + 1) // 10 for first, last in zip(cols["first_step"], cols["last_step"], strict=True)]
    assert max(sizes[:-1] or [0]) - min(sizes[:-1] or [0]) <= block  # the last block may be cut short
    if n <= max_points:
        assert sizes == [1] * n


def _assert_buckets_match_the_oracle(cols, recs, oracle, close):
    """Every bucket equals the oracle over exactly the records between its first and last step."""
    covered = []
    for i, (first, last) in enumerate(zip(cols["first_step"], cols["last_step"], strict=True)):
        bucket = [r for r in recs if first <= r["first_step"] and r["last_step"] <= last]
        assert (bucket[0]["first_step"], bucket[-1]["last_step"]) == (first, last)
        covered += bucket
        got = {name: values[i] for name, values in cols.items()}
        close(
            got,
            oracle(bucket),
            [
                "tflops_useful",
                "tflops_thd_min",
                "tflops_thd_max",
                "step_time_s",
                "step_time_s_min",
                "step_time_s_max",
                "loss",
                "syncs_per_iter",
                "padding_pct",
                "overcount_pct",
            ],
        )
    return covered


def test_series_step_range(any_client, thousand, oracle, close):
    new_part = any_client.get(f"{RUN}/series", params={"max_points": 500, "step_min": 9901}).json()
    assert new_part["points"] == 10  # intervals 990..999, one bucket each
    assert new_part["columns"]["first_step"] == [r["first_step"] for r in thousand[990:]]
    window = any_client.get(f"{RUN}/series", params={"max_points": 2, "step_min": 101, "step_max": 200}).json()
    assert window["points"] == 2
    # exactly intervals 10..19 (steps 101..200), cut at a block boundary (16 = 4^2)
    assert _assert_buckets_match_the_oracle(window["columns"], thousand, oracle, close) == thousand[10:20]
    assert window["columns"]["first_step"] == [101, 161]
    # a range that starts and ends inside intervals keeps the intervals it touches
    inside = any_client.get(f"{RUN}/series", params={"max_points": 7, "step_min": 1234, "step_max": 8765}).json()
    assert _assert_buckets_match_the_oracle(inside["columns"], thousand, oracle, close) == thousand[123:877]
    assert inside["points"] == 7
    empty = any_client.get(f"{RUN}/series", params={"step_min": 10_001}).json()
    assert empty["points"] == 0 and empty["columns"]["tflops_thd"] == []
    assert any_client.get(f"{RUN}/series", params={"step_min": 300, "step_max": 200}).json()["points"] == 0
    assert any_client.get(f"{RUN}/series", params={"max_points": 0}).status_code == 422


def test_totals_match_an_independent_computation(any_client, thousand, oracle, close):
    run = any_client.get(RUN).json()
    assert (run["records"], run["last_step"]) == (1000, 10_000)
    want = oracle(thousand)
    assert {k: run["totals"][k] for k in ("steps", "tokens", "real_tokens", "documents", "packs")} == {
        k: want[k] for k in ("steps", "tokens", "real_tokens", "documents", "packs")
    }
    close(
        run["totals"],
        want,
        [
            "gpu_time_s",
            "flops_bshd",
            "flops_thd",
            "flops_useful",
            "tflops_bshd",
            "tflops_thd",
            "tflops_useful",
            "mfu_bshd",
            "mfu_thd",
            "mfu_useful",
            "overcount_pct",
            "step_time_s",
            "tokens_per_gpu_s",
            "padding_pct",
            "syncs_per_iter",
        ],
    )
    assert run["totals"]["overcount_pct"] > 0  # dense packs of 4096 over-count attention


@pytest.mark.parametrize("ranks", [1, 3])
def test_steady_leaves_out_the_first_interval_of_every_rank(any_client, records, oracle, close, ranks):
    """`steady` is the totals' metrics over every interval after the run's first one (all ranks):
    a slow first interval (compilation, capture) weighs on the totals but not on it."""
    recs = [r | {"rank": k} for k in range(ranks) for r in records(40, start=3, seed=11 + k)]
    for r in recs:
        if r["interval"] == 3:  # the warm-up: 50 times slower, no loss on one rank
            r["gpu_time_s"] *= 50
            if r["rank"] == ranks - 1:
                r["loss"] = None
    assert any_client.post(f"{RUN}/intervals", json={"intervals": recs}).json()["accepted"] == 40 * ranks
    run = any_client.get(RUN).json()
    want = oracle([r for r in recs if r["interval"] > 3])
    close(run["steady"], want, [k for k in run["steady"] if k in want])  # every metric the oracle has
    assert run["totals"]["step_time_s"] > 1.5 * run["steady"]["step_time_s"]
    # The runs list and the compare page answer the same.
    listed = next(r for r in any_client.get(RUNS).json()["runs"] if r["run_id"] == "run-1")
    assert listed["steady"] == run["steady"]
    compared = any_client.get("/api/v1/compare", params={"run_id": "run-1"}).json()["runs"][0]
    assert compared["steady"] == run["steady"]


def test_steady_is_null_until_a_second_interval(any_client, records):
    recs = records(2, seed=5)
    assert any_client.post(f"{RUN}/intervals", json={"intervals": [recs[0] | {"rank": 1}, recs[0]]}).status_code == 200
    assert any_client.get(RUN).json()["steady"] is None  # one interval, two ranks
    assert any_client.post(f"{RUN}/intervals", json={"intervals": recs[1:]}).status_code == 200
    run = any_client.get(RUN).json()
    assert (
        run["steady"]["steps"] == recs[1]["steps"] and run["totals"]["steps"] == recs[0]["steps"] + recs[1]["steps"]
    )  # each step once, however many ranks ran it


def test_mfu_is_null_without_a_peak(client, new_run, records):
    body = new_run()
    body["hardware"] = {"gpu_name": "Unknown", "gpu_count": 1, "peak_tflops": None}
    client.post(RUNS, json=body)
    client.post(f"{RUN}/intervals", json={"intervals": records(3)})
    totals = client.get(RUN).json()["totals"]
    assert totals["mfu_thd"] is None and totals["tflops_thd"] > 0
    assert client.get(f"{RUN}/series").json()["columns"]["mfu_thd"] == [None, None, None]


def test_csv_has_one_row_per_interval_and_derived_columns(any_client, thousand, oracle):
    response = any_client.get(f"{RUN}/intervals.csv")
    assert response.headers["content-type"].startswith("text/csv")
    assert 'filename="run-1.csv"' in response.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(response.text)))
    assert len(rows) == 1000
    assert set(DOCUMENTED_CSV_COLUMNS) <= set(rows[0])
    for row, rec in zip(rows, thousand, strict=True):
        assert int(row["interval"]) == rec["interval"]
        assert int(row["tokens"]) == rec["tokens"]
        assert float(row["gpu_time_s"]) == rec["gpu_time_s"]  # floats round-trip exactly
        want = oracle([rec])
        for name in (
            "tflops_bshd",
            "tflops_thd",
            "tflops_useful",
            "mfu_thd",
            "overcount_pct",
            "tokens_per_gpu_s",
            "padding_pct",
        ):
            assert float(row[name]) == pytest.approx(want[name], rel=1e-9), name


def _csv_expected(rec, spec, peak):
    """One interval's derived CSV columns, written out from the documented formulas (docs/flops.md)
    with exact integers, independently of the catalogue's code; None where undefined."""

    def ratio(num, den):
        return None if num is None or not den else num / den

    gpu_seconds = rec["gpu_time_s"] * rec["gpus"]
    flops = {
        "bshd": rec["tokens"] * spec.c_lin + rec["seqlen_sq_sum_bshd"] * spec.c_core,
        "thd": rec["tokens"] * spec.c_lin + rec["seqlen_sq_sum_thd"] * spec.c_core,
        "useful": rec["real_tokens"] * spec.c_lin + rec["seqlen_sq_sum_thd"] * spec.c_core,
    }
    energy = (rec.get("gpu") or {}).get("energy_j")
    out = {
        "overcount_pct": 100 * (flops["bshd"] / flops["thd"] - 1),
        "step_time_s": rec["gpu_time_s"] / rec["steps"],
        "tokens_per_gpu_s": ratio(rec["tokens"], rec["gpu_time_s"] * rec["gpus"]),
        "real_tokens_per_gpu_s": ratio(rec["real_tokens"], rec["gpu_time_s"] * rec["gpus"]),
        "padding_pct": 100 * (1 - rec["real_tokens"] / rec["tokens"]),
        "syncs_per_iter": ratio(rec["syncs"]["total"], rec["steps"] - rec["syncs"].get("uncounted_steps", 0)),
        "energy_per_token_j": ratio(energy, rec["real_tokens"]),
        "attention_share_pct": 100 * rec["seqlen_sq_sum_thd"] * spec.c_core / flops["thd"],
        "attention_full_pct": 100 * rec["seqlen_sq_sum_thd"] * spec.c_core / flops["thd"],
        "attention_sliding_pct": 0.0,  # the test model has full-attention layers only
        "attention_chunked_pct": 0.0,
        "vision_share_pct": 0.0,  # and no vision tower
        "audio_share_pct": 0.0,  # nor audio tower
        # The ledger's measurements: the records carry none (an older agent's), so none is defined.
        "data_wait_step_s": None,
        "sync_idle_pct": None,
        "launch_idle_pct": None,
    }
    for kind, f in flops.items():
        out[f"tflops_{kind}"] = ratio(f / 1e12, gpu_seconds)
        out[f"mfu_{kind}"] = ratio(out[f"tflops_{kind}"], peak)
    return out


@pytest.mark.parametrize("peak", [989.0, None])
def test_csv_derived_columns_equal_an_independent_computation(database_url, make_client, new_run, records, spec, peak):
    client = make_client(database_url)
    body = new_run()
    body["hardware"] = {"gpu_name": "H200", "gpu_count": 8, "peak_tflops": peak}
    assert client.post(RUNS, json=body).status_code == 201
    recs = records(300, seed=11) + records(20, start=300, seed=12, gpus=2, rank=1)
    recs[3]["gpu_time_s"] = 0.0  # rates undefined: empty cells
    recs[4]["loss"] = None
    for r in recs[5:50]:
        r["gpu"] = {"util_pct": 90.0, "power_w": 640.5, "energy_j": 1234.5678}
    assert client.post(f"{RUN}/intervals", json={"intervals": recs}).json()["accepted"] == len(recs)

    rows = list(csv.DictReader(io.StringIO(client.get(f"{RUN}/intervals.csv").text)))
    recs.sort(key=lambda r: (r["interval"], r["rank"]))
    assert len(rows) == len(recs)
    for row, rec in zip(rows, recs, strict=True):
        assert (int(row["interval"]), int(row["rank"])) == (rec["interval"], rec["rank"])
        want = _csv_expected(rec, spec, peak)
        assert set(want) == set(csv_export.CSV_DERIVED_COLUMNS)
        for name, value in want.items():
            if value is None:
                assert row[name] == "", (name, rec["interval"])
            else:
                assert float(row[name]) == pytest.approx(value, rel=1e-12), (name, rec["interval"])


def test_histograms_default_to_the_latest_interval(client, run, records):
    recs = records(4)
    client.post(f"{RUN}/intervals", json={"intervals": recs})
    latest = client.get(f"{RUN}/histograms").json()
    assert (latest["interval"], latest["first_step"], latest["last_step"]) == (3, 31, 40)
    assert latest["edges"] == [2**b for b in range(24)]
    assert latest["documents"] == recs[3]["histograms"]["documents"]
    assert client.get(f"{RUN}/histograms", params={"interval": 9}).status_code == 404


def test_ranks_of_one_interval_share_a_bucket(client, run, records, oracle, close):
    rank0 = records(6, seed=1, gpus=4)
    rank1 = records(6, seed=2, gpus=4, rank=1)
    client.post(f"{RUN}/intervals", json={"intervals": rank0 + rank1})
    cols = client.get(f"{RUN}/series", params={"max_points": 3}).json()["columns"]
    assert cols["first_step"] == [1, 21, 41]
    for i in range(3):
        bucket = rank0[2 * i : 2 * i + 2] + rank1[2 * i : 2 * i + 2]
        close({"t": cols["tflops_thd"][i]}, {"t": oracle(bucket)["tflops_thd"]})
    hist = client.get(f"{RUN}/histograms", params={"interval": 2}).json()
    counts = [r[2]["histograms"]["documents"]["count"] for r in (rank0, rank1)]
    assert hist["documents"]["count"] == [a + b for a, b in zip(*counts, strict=True)]


@pytest.mark.parametrize(("n", "columns"), [(1, 200), (7, 200), (301, 25), (50, 50)])
def test_histograms_over_time_spread_evenly_and_sum_ranks(client, run, records, n, columns):
    recs = [r for rank in range(2) for r in records(n, start=3, seed=rank, gpus=4, rank=rank)]
    for at in range(0, len(recs), 500):
        assert client.post(f"{RUN}/intervals", json={"intervals": recs[at : at + 500]}).status_code == 200
    heat = client.get(f"{RUN}/histograms/over-time", params={"columns": columns}).json()
    assert (heat["first_interval"], heat["last_interval"]) == (3, n + 2)
    shown = heat["intervals"]
    assert len(shown) == min(n, columns) and shown == sorted(set(shown))
    assert shown[0] == 3 and shown[-1] == n + 2  # the ends are always shown
    gaps = [b - a for a, b in itertools.pairwise(shown)]
    assert not gaps or max(gaps) - min(gaps) <= 1  # evenly spread
    for at, interval in enumerate(shown):
        ranks = [r for r in recs if r["interval"] == interval]
        assert heat["first_step"][at] == ranks[0]["first_step"] and heat["last_step"][at] == ranks[0]["last_step"]
        for kind in ("documents", "packs"):
            for part in ("count", "tokens"):
                want = [sum(r["histograms"][kind][part][b] for r in ranks) for b in range(24)]
                assert heat[kind][part][at] == want, (interval, kind, part)


def test_histograms_over_time_of_an_empty_run(client, run):
    assert client.get(f"{RUN}/histograms/over-time").status_code == 404
    assert client.get(f"{RUN}/histograms/over-time", params={"columns": 0}).status_code == 422


@pytest.mark.parametrize("window", ["run", "steady"])
def test_sync_sites_sum_over_the_run(client, run, records, window):
    recs = records(5)  # intervals 2 and (one in three) have their syncs uncounted
    assert [r["syncs"].get("uncounted_steps", 0) for r in recs] == [0, 0, 10, 0, 0]
    client.post(f"{RUN}/intervals", json={"intervals": recs})
    body = client.get(f"{RUN}/sync-sites", params={"window": window}).json()
    covered = recs[1:] if window == "steady" else recs  # steady leaves the warm-up interval out
    steps = sum(r["steps"] for r in covered)
    counted = steps - 10  # syncs per iteration divide by the steps whose syncs were counted
    want = {
        site: sum(s["count"] for r in covered for s in r["syncs"]["sites"] if s["site"] == site)
        for site in ("train.py:88", "model.py:12")
    }
    assert body["window"] == window and body["first_step"] == covered[0]["first_step"]
    assert body["counted_share"] == pytest.approx(counted / steps)
    assert body["syncs_per_iter"] == pytest.approx(sum(r["syncs"]["total"] for r in covered) / counted)
    assert [s["count"] for s in body["sites"]] == sorted(want.values(), reverse=True)
    for s in body["sites"]:
        assert s["count"] == want[s["site"]]
        assert s["per_iter"] == pytest.approx(want[s["site"]] / counted)
    assert len(client.get(f"{RUN}/sync-sites", params={"limit": 1}).json()["sites"]) == 1


def test_syncs_per_iteration_is_undefined_where_no_step_was_counted(client, run, records):
    recs = records(3)[2:]  # interval 2 alone: its syncs were not counted
    client.post(f"{RUN}/intervals", json={"intervals": recs})
    body = client.get(f"{RUN}/sync-sites").json()
    assert body["counted_share"] == 0 and body["syncs_per_iter"] is None and body["sites"] == []
    assert client.get(RUN).json()["totals"]["syncs_per_iter"] is None


def test_more_uncounted_steps_than_steps_is_refused(client, run, records):
    (rec,) = records(1)
    rec["syncs"]["uncounted_steps"] = rec["steps"] + 1
    answer = client.post(f"{RUN}/intervals", json={"intervals": [rec]})
    assert answer.status_code == 422
    assert "syncs.uncounted_steps (11) is more than the interval's steps (10)" in answer.text


def test_list_and_compare(client, new_run, records):
    client.post(RUNS, json=new_run("old", started_at="2026-11-28T09:00:00Z"))
    client.post(RUNS, json=new_run("new", started_at="2026-11-29T09:00:00Z"))
    client.post(f"{RUNS}/new/intervals", json={"intervals": records(2)})
    runs = client.get(RUNS).json()["runs"]
    assert [r["run_id"] for r in runs] == ["new", "old"]
    assert (runs[0]["records"], runs[1]["records"], runs[1]["totals"]) == (2, 0, None)

    compared = client.get("/api/v1/compare", params=[("run_id", "old"), ("run_id", "new")]).json()["runs"]
    assert [r["run_id"] for r in compared] == ["old", "new"]
    assert compared[1]["totals"] == runs[0]["totals"]
    missing = client.get("/api/v1/compare", params=[("run_id", "new"), ("run_id", "gone")])
    assert missing.status_code == 404 and "gone" in missing.json()["detail"]
    assert client.get(f"{RUNS}/gone").status_code == 404


def test_compare_tests_step_time_on_recent_windows(client, new_run, records):
    for run_id in ("a", "b", "c"):
        client.post(RUNS, json=new_run(run_id))
    a = records(60, seed=1)
    b = records(60, seed=2)
    c = records(60, seed=3)
    for rec in c:  # run c: every step 20% slower than it would be
        rec["gpu_time_s"] *= 1.2
    for run_id, recs in (("a", a), ("b", b), ("c", c)):
        assert client.post(f"{RUNS}/{run_id}/intervals", json={"intervals": recs}).status_code == 200
    body = client.get(
        "/api/v1/compare", params=[("run_id", "a"), ("run_id", "b"), ("run_id", "c"), ("window", 50)]
    ).json()
    tests = {t["run_id"]: t for t in body["step_time_tests"]}
    assert set(tests) == {"b", "c"} and all(t["baseline_run_id"] == "a" for t in tests.values())

    # The window holds the 50 most recent intervals of each run (indexes 10..59).
    def recent(recs):
        return [r["gpu_time_s"] / r["steps"] for r in recs[10:]]

    expected = mann_whitney_u(recent(c), recent(a))
    assert tests["c"]["n"] == tests["c"]["n_baseline"] == 50
    assert tests["c"]["p_value"] == pytest.approx(expected["p_value"])
    assert tests["c"]["median_step_s"] == pytest.approx(statistics.median(recent(c)))
    assert tests["c"]["p_value"] < tests["b"]["p_value"]
    only = client.get("/api/v1/compare", params={"run_id": "a"}).json()
    assert only["step_time_tests"] == []


def test_the_step_time_test_leaves_out_the_warm_up_interval(client, new_run, records):
    """A window that reaches back to a run's first interval leaves it out, as `steady` does."""
    a, b = records(12, seed=1), records(12, seed=2)
    a[0]["gpu_time_s"] *= 40  # compilation in the first interval
    for run_id, recs in (("a", a), ("b", b)):
        assert client.post(RUNS, json=new_run(run_id)).status_code == 201
        assert client.post(f"{RUNS}/{run_id}/intervals", json={"intervals": recs}).status_code == 200
    (test,) = client.get("/api/v1/compare", params=[("run_id", "a"), ("run_id", "b")]).json()["step_time_tests"]
    assert test["n"] == test["n_baseline"] == 11

    def steady(recs):
        return [r["gpu_time_s"] / r["steps"] for r in recs[1:]]

    assert test["p_value"] == pytest.approx(mann_whitney_u(steady(b), steady(a))["p_value"])
    assert test["median_step_s_baseline"] == pytest.approx(statistics.median(steady(a)))
    # A window short of the first interval takes the most recent ones as before.
    (short,) = client.get("/api/v1/compare", params=[("run_id", "a"), ("run_id", "b"), ("window", 5)]).json()[
        "step_time_tests"
    ]
    assert short["n"] == short["n_baseline"] == 5
