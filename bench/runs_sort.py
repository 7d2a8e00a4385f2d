"""The runs list at --runs runs (default 10,000), one page of 100, sorted the default way (newest
first) and by every derived catalogue metric (descending, and ascending for a few), over HTTP
against one uvicorn process, the sorts alternated in each round so that the machine's load weighs
on all alike. The default sort is timed twice a round: the ratio of its second slot to its first
is the noise floor of the ratios. The same sorts are also timed in this process (list_runs alone:
the read without HTTP and the page's JSON).

Each run has --intervals intervals of 2 ranks (bench_data's records), stored in-process
(ingest_together, many runs a transaction). Also checks that the page's order is that of the
metric as the summaries show it (steady, else totals), runs without it last.

The kept metrics are a cache that a metric sort refreshes (store/metric_values.py): the first
in-process sort computes every run's (timed: first_sort_s, what the server's start does after an
upgrade), and `after_ingest` times, each round after a new interval into --stale runs, the
default sort, the first metric sort (which recomputes those runs) and the same sort again.

    python bench/runs_sort.py --database sqlite [--runs 10000] [--repeat 15]

Prints one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import time
from typing import Any

import httpx
from backend_scale import start_server, stop_server
from bench_data import record, run_body, scratch_database
from sqlalchemy.orm import Session

from packscope.backend.api.schemas import RunCreate
from packscope.backend.ingest.batches import create_or_resume_run, ingest_together
from packscope.backend.ingest.rows import parsed_records
from packscope.backend.reads.runs_list import DERIVED_SORT_KEYS, list_runs
from packscope.backend.store.db import WRITES, make_engine, make_sessionmaker, upgrade_schema
from packscope.core.catalogue import METRIC

DEFAULT, AGAIN = "-started_at", "-started_at again"  # the default sort's two slots a round
ASCENDING = ("step_time_s", "loss", "padding_pct", "energy_per_token_j")
SORTS = (DEFAULT, AGAIN, *(f"-{key}" for key in DERIVED_SORT_KEYS), *ASCENDING)


def log(message: str) -> None:
    print(f"[runs_sort {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def fill(engine: Any, runs: int, intervals: int) -> None:
    rng = random.Random(5)
    with Session(engine) as session:
        for i in range(runs):
            body = run_body(f"run-{i:05d}") | {"started_at": f"2026-11-{1 + i % 28:02d}T{i % 24:02d}:00:00Z"}
            create_or_resume_run(session, RunCreate.model_validate(body))
    writes = engine.execution_options(**{WRITES: True})
    for at in range(0, runs, 250):
        batches = []
        for i in range(at, min(at + 250, runs)):
            recs = [record(k, rank, rng) for k in range(intervals) for rank in range(2)]
            for r in recs:  # every run its own speed
                r["gpu_time_s"] *= 0.5 + (i * 7919 % 1000) / 1000
            batches.append((f"run-{i:05d}", parsed_records(recs)))
        ingest_together(writes, batches)


def request_sort(sort: str) -> str:
    return DEFAULT if sort == AGAIN else sort


def ratios(times: dict[str, list[float]]) -> dict[str, Any]:
    """Per sort its median ms and its ratio to the default's; the largest derived sort's ratio,
    and the default's second slot over its first (the noise floor)."""
    default = statistics.median(times[DEFAULT])
    over = {s: round(statistics.median(v) / default, 2) for s, v in times.items()}
    derived = {s: r for s, r in over.items() if s not in (DEFAULT, AGAIN)}
    worst = max(derived, key=derived.__getitem__)
    return {
        "ms_p50": {s: round(statistics.median(v) * 1e3, 1) for s, v in times.items()},
        "over_default": over,
        "derived_over_default": {
            "median": round(statistics.median(derived.values()), 2),
            "max": derived[worst],
            "max_sort": worst,
        },
        "noise_default_again_over_default": over[AGAIN],
    }


def in_process(engine: Any, repeat: int) -> dict[str, Any]:
    """list_runs alone (the query and the page's Run objects), every sort, alternated per round;
    and the first metric sort's seconds (every run's values computed)."""
    times: dict[str, list[float]] = {s: [] for s in SORTS}
    with make_sessionmaker(engine)() as session:
        t0 = time.perf_counter()
        list_runs(session, sort=SORTS[2], limit=100)
        first_sort_s = round(time.perf_counter() - t0, 2)
        session.rollback()
        for sort in SORTS:  # warm
            list_runs(session, sort=request_sort(sort), limit=100)
        for _ in range(repeat):
            for sort in SORTS:
                session.expunge_all()
                t0 = time.perf_counter()
                list_runs(session, sort=request_sort(sort), limit=100)
                times[sort].append(time.perf_counter() - t0)
                session.rollback()
    return ratios(times) | {"first_sort_s": first_sort_s}


def after_ingest(engine: Any, base: str, runs: int, intervals: int, stale: int, repeat: int) -> dict[str, Any]:
    """Per round: one new interval (2 ranks) into `stale` runs, then over HTTP the default sort, a
    metric sort (the first after the batches: it recomputes those runs) and that sort again."""
    http = httpx.Client(base_url=base, timeout=120)
    writes = engine.execution_options(**{WRITES: True})
    rng = random.Random(9)
    times: dict[str, list[float]] = {"default": [], "first metric sort": [], "again": []}
    keys = [f"-{key}" for key in DERIVED_SORT_KEYS]
    for k in range(repeat):
        chosen = rng.sample(range(runs), stale)
        recs = [record(intervals + k, rank, rng) for rank in range(2)]
        ingest_together(writes, [(f"run-{i:05d}", parsed_records(recs)) for i in chosen])
        metric = keys[k % len(keys)]
        for name, sort in (("default", DEFAULT), ("first metric sort", metric), ("again", metric)):
            t0 = time.perf_counter()
            response = http.get("/api/v1/runs", params={"sort": sort, "limit": 100})
            times[name].append(time.perf_counter() - t0)
            assert response.status_code == 200, response.text[:200]
    default = statistics.median(times["default"])
    return {
        "stale_runs": stale,
        "ms_p50": {name: round(statistics.median(v) * 1e3, 1) for name, v in times.items()},
        "over_default": {name: round(statistics.median(v) / default, 2) for name, v in times.items()},
    }


def shown_value(run: dict[str, Any], key: str) -> float | None:
    window = run["totals"] if METRIC[key].amount else (run["steady"] or run["totals"])
    return None if window is None else window.get(key)


def over_http(base: str, runs: int, repeat: int) -> dict[str, Any]:
    http = httpx.Client(base_url=base, timeout=120)
    times: dict[str, list[float]] = {s: [] for s in SORTS}
    orders_ok = {}
    for sort in SORTS:  # a first call each (warm caches), and the order checked
        page = http.get("/api/v1/runs", params={"sort": request_sort(sort), "limit": 100}).json()
        key, descending = sort.lstrip("-"), sort.startswith("-")
        if key in METRIC:
            values = [shown_value(r, key) for r in page["runs"]]
            shown = [v for v in values if v is not None]
            in_order = shown == sorted(shown, reverse=descending) and values[: len(shown)] == shown
            orders_ok[sort] = in_order and page["total"] == runs
    for _ in range(repeat):
        for sort in SORTS:
            t0 = time.perf_counter()
            response = http.get("/api/v1/runs", params={"sort": request_sort(sort), "limit": 100})
            times[sort].append(time.perf_counter() - t0)
            assert response.status_code == 200, response.text[:200]
    return ratios(times) | {"order_matches_the_metric": all(orders_ok.values()), "orders": orders_ok}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--intervals", type=int, default=3)
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--stale", type=int, default=5, help="runs given a new interval before each after_ingest sort")
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    with scratch_database(args.database) as url:
        engine = make_engine(url)
        upgrade_schema(engine)
        log(f"filling {args.runs} runs")
        t0 = time.perf_counter()
        fill(engine, args.runs, args.intervals)
        if args.database == "postgresql":  # the planner's statistics, as autovacuum gathers them within a minute
            with engine.begin() as connection:
                connection.exec_driver_sql("ANALYZE")
        out: dict[str, Any] = {
            "database": args.database,
            "runs": args.runs,
            "fill_s": round(time.perf_counter() - t0, 1),
            "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(),
        }
        out["in_process"] = in_process(engine, args.repeat)
        server, base = start_server(url)
        try:
            out["http"] = over_http(base, args.runs, args.repeat)
            out["after_ingest"] = after_ingest(engine, base, args.runs, args.intervals, args.stale, args.repeat)
            out["load_avg_end"] = os.getloadavg()
        finally:
            stop_server(server)
            engine.dispose()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
