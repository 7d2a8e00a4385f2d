"""The aggregates kept at ingest, in this process: CPU per ingested row of `store_aggregates`
(rollups, channel rollups, run totals, sync sites, the first interval) for batches of 64
consecutive intervals with 1 and with 8 ranks and for batches of one record, and the latency of
series reads on a long run.

    python bench/rollups.py --database sqlite|postgresql [--batches 300] [--channels 0]
        [--series-intervals 1000000] [--repeat 15] [--packscope DIR]

--packscope DIR times another checkout's backend: DIR holds a `packscope` package laid out as the
wheel installs it (`git archive REV` with backend/ as packscope/backend, alembic/ as
packscope/migrations, agent/ and frontend/ likewise); the editable install's import hook is set
aside so that nothing is imported from this checkout.

* store: each batch of 64 rows is written to `intervals` (not timed) and handed to
  store_aggregates in one transaction (timed, CPU with time.process_time and wall with
  perf_counter); 64 consecutive intervals of 1 rank, 8 intervals x 8 ranks, or 64 consecutive
  intervals of one rank with 8 ranks taking turns (as 8 agents send); the batches are cut into 5
  groups and each group's per-row figure reported (median, min, max). On PostgreSQL the
  CPU is this process's only (the server's is not counted), so the wall time is reported too.
* kept_metrics: the same batches with and without a refresh of the run's kept metrics (as a
  metric sort of the runs list does) between them: the batches' own cost should not differ.
* series: a run of --series-intervals intervals (1 rank) filled through the same two calls in
  batches of 4096, then series.series with max_points=1000 over the whole run and over windows
  of several widths (p50 / p95 ms of --repeat calls each), and the same for 8 ranks over
  --series-intervals // 8 intervals.

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

if "--packscope" in sys.argv:  # before anything imports packscope
    sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
    sys.path.insert(0, sys.argv[sys.argv.index("--packscope") + 1])

from bench_data import record, run_body, scratch_database  # after the sys.path set-up above
from sqlalchemy import select

from packscope.backend.ingest.rows import parsed_records
from packscope.backend.store.aggregates import store_aggregates
from packscope.backend.store.db import make_engine, make_sessionmaker, upgrade_schema

try:
    from packscope.backend.store.metric_values import refresh
except ImportError:  # --packscope of a backend without kept metrics
    refresh = None  # type: ignore[assignment]
from packscope.backend.store.models import COLUMN_AT, Run
from packscope.backend.store.runs import coefficients
from packscope.backend.store.writes import write

try:
    from packscope.backend.reads.series import series
except ImportError:  # --packscope DIR of a commit from before the series left queries.py
    from packscope.backend.reads.queries import series  # type: ignore[import-not-found,no-redef]

BATCH = 64
CHANNELS = ("code", "math", "web", "books")


def make_run(make_session: Any, run_id: str) -> tuple[int, Any]:
    body = run_body(run_id)
    with make_session() as session:
        from packscope.backend.api.schemas import RunCreate
        from packscope.backend.ingest.batches import create_or_resume_run

        run, _ = create_or_resume_run(session, RunCreate.model_validate(body))
        return run.id, coefficients(run)


Batch = tuple[list[tuple[Any, ...]], dict[str, int], dict[str, int]]


def batch_rows(run_pk: int, intervals: range, ranks: int, channels: int, rng: random.Random) -> Batch:
    """ROW_COLUMNS tuples sorted by (interval, rank), their sync sites summed, and those of the
    rows of their lowest interval (the first `ranks`) summed."""
    recs = []
    for i in intervals:
        for rank in range(ranks):
            r = record(i, rank, rng)
            if channels:
                names = CHANNELS[:channels]
                r["channel_loss"] = {c: rng.uniform(1, 4) for c in names}
                r["channel_tokens"] = {c: rng.randint(1, 5000) for c in names}
            recs.append(r)
    parsed = parsed_records(recs)
    return [(run_pk, *values) for values in parsed.values], summed(parsed.sites), summed(parsed.sites[:ranks])


def summed(per_row: Sequence[Mapping[str, int]]) -> dict[str, int]:
    sites: dict[str, int] = {}
    for per in per_row:
        for site, n in per.items():
            sites[site] = sites.get(site, 0) + n
    return sites


# A backend from before the first interval's sync sites were kept (--packscope DIR) takes no lowest_sites.
_LOWEST_SITES = "lowest_sites" in inspect.signature(store_aggregates).parameters


def aggregate(connection: Any, run_pk: int, c: Any, batch: Batch) -> None:
    rows, sites, lowest_sites = batch
    if _LOWEST_SITES:
        store_aggregates(connection, run_pk, c, rows, sites, lowest_sites=lowest_sites)
    else:
        store_aggregates(connection, run_pk, c, rows, sites)  # type: ignore[call-arg]


def prepared_batches(run_pk: int, mode: str, batches: int, channels: int) -> list[Batch]:
    """The batches of `mode` (store's modes) as batch_rows gives them."""
    rng = random.Random(mode)
    prepared = []
    for b in range(batches):
        if mode == "1 rank":
            prepared.append(batch_rows(run_pk, range(b * BATCH, (b + 1) * BATCH), 1, channels, rng))
        elif mode == "1 record":
            prepared.append(batch_rows(run_pk, range(b, b + 1), 1, channels, rng))
        elif mode == "8 ranks":
            prepared.append(batch_rows(run_pk, range(b * 8, (b + 1) * 8), 8, channels, rng))
        else:
            rows, sites, lowest = batch_rows(run_pk, range((b // 8) * BATCH, (b // 8 + 1) * BATCH), 1, channels, rng)
            rank_at = COLUMN_AT["rank"]
            prepared.append(([(*row[:rank_at], b % 8, *row[rank_at + 1 :]) for row in rows], sites, lowest))
    return prepared


def store(engine: Any, make_session: Any, mode: str, batches: int, channels: int) -> dict[str, Any]:
    """CPU and wall time of store_aggregates per row. Modes: "1 rank" (64 consecutive intervals a
    batch), "8 ranks" (8 consecutive intervals x 8 ranks a batch), "8 senders" (64 consecutive
    intervals of one rank a batch, the ranks in turn, as 8 agents send them), "1 record" (one
    interval of one rank a batch, as a one-rank agent sends at each interval: the cost a batch
    pays whatever its size)."""
    run_pk, c = make_run(make_session, f"store-{mode.replace(' ', '-')}-{channels}")
    prepared = prepared_batches(run_pk, mode, batches, channels)
    cpu: list[float] = []
    wall: list[float] = []
    for batch in prepared:
        with engine.begin() as connection:
            write(connection, "intervals", "insert", batch[0])
            t0, c0 = time.perf_counter(), time.process_time()
            aggregate(connection, run_pk, c, batch)
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - t0)
    groups = 5
    size = len(cpu) // groups
    per_batch = len(prepared[0][0])
    cpu_us = [sum(cpu[g * size : (g + 1) * size]) / (size * per_batch) * 1e6 for g in range(groups)]
    wall_us = [sum(wall[g * size : (g + 1) * size]) / (size * per_batch) * 1e6 for g in range(groups)]
    return {
        "mode": mode,
        "channels": channels,
        "rows": batches * per_batch,
        "cpu_us_per_row": round(statistics.median(cpu_us), 2),
        "cpu_us_per_row_min_max": [round(min(cpu_us), 2), round(max(cpu_us), 2)],
        "wall_us_per_row": round(statistics.median(wall_us), 2),
        "wall_us_per_row_min_max": [round(min(wall_us), 2), round(max(wall_us), 2)],
    }


def kept_metrics_cost(engine: Any, make_session: Any, mode: str, batches: int) -> dict[str, Any]:
    """Whether ingest pays for the runs list's kept metrics (store/metric_values.py): CPU and wall
    µs a batch of store_aggregates when a reader refreshes the run's values after every batch (as
    a metric sort does: "sorted") and when none does ("unsorted"), on one run's batches in one
    process, the two taking turns (ABBA), so the machine's load weighs on both alike; and what
    that refresh costs the reader (one stale run)."""
    run_pk, c = make_run(make_session, f"kept-{mode.replace(' ', '-')}")
    refresh(engine)  # the runs stored before: fresh
    cpu: dict[str, list[float]] = {"sorted": [], "unsorted": [], "refresh": []}
    wall: dict[str, list[float]] = {"sorted": [], "unsorted": [], "refresh": []}
    for k, batch in enumerate(prepared_batches(run_pk, mode, batches, 0)):
        which = "sorted" if k % 4 in (0, 3) else "unsorted"
        rows = batch[0]
        with engine.begin() as connection:
            write(connection, "intervals", "insert", rows)
            t0, c0 = time.perf_counter(), time.process_time()
            aggregate(connection, run_pk, c, batch)
            cpu[which].append(time.process_time() - c0)
            wall[which].append(time.perf_counter() - t0)
        if which == "sorted":
            t0, c0 = time.perf_counter(), time.process_time()
            refreshed = refresh(engine)
            cpu["refresh"].append(time.process_time() - c0)
            wall["refresh"].append(time.perf_counter() - t0)
            assert refreshed == 1, refreshed
    out: dict[str, Any] = {"mode": mode, "rows_a_batch": len(rows)}
    for name, times in (("cpu", cpu), ("wall", wall)):  # PostgreSQL: the server's CPU is in the wall time alone
        sorted_us, unsorted_us, refresh_us = (statistics.median(times[w]) * 1e6 for w in times)
        out[f"{name}_us_a_batch"] = {"sorted": round(sorted_us, 1), "unsorted": round(unsorted_us, 1)}
        out[f"{name}_sorted_over_unsorted"] = round(sorted_us / unsorted_us, 3)
        out[f"{name}_us_a_refresh"] = round(refresh_us, 1)
    return out


def fill(engine: Any, make_session: Any, run_id: str, intervals: int, ranks: int) -> int:
    """A run of `intervals` intervals x `ranks` ranks, in batches of 4096 rows re-numbered from a template."""
    run_pk, c = make_run(make_session, run_id)
    template, _, _ = batch_rows(run_pk, range(BATCH), 1, 2, random.Random(0))
    at_i, at_r, at_f, at_l = (COLUMN_AT[k] for k in ("interval", "rank", "first_step", "last_step"))
    per = 4096 // ranks
    for start in range(0, intervals, per):
        rows = []
        for i in range(start, min(start + per, intervals)):
            for rank in range(ranks):
                row = list(template[(i * 7 + rank) % BATCH])
                row[at_i], row[at_r], row[at_f], row[at_l] = i, rank, i * 10 + 1, i * 10 + 10
                rows.append(tuple(row))
        with engine.begin() as connection:
            write(connection, "intervals", "insert", rows)
            aggregate(connection, run_pk, c, (rows, {"train.py:1": len(rows)}, {"train.py:1": ranks}))
    return run_pk


def p(values: list[float], q: float) -> float:
    return round(sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000, 2)


def reads(make_session: Any, run_id: str, intervals: int, repeat: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    windows: dict[str, tuple[int, int] | None] = {"whole": None}
    for width in (600, 3000, 12_000, 48_000, 250_000):
        if width < intervals:
            middle = intervals // 3
            windows[f"{width} intervals"] = (middle * 10 + 5, (middle + width) * 10 - 5)
    with make_session() as session:
        run = session.scalars(select(Run).where(Run.run_id == run_id)).one()
        for name, window in windows.items():
            step_min, step_max = window or (None, None)
            times = []
            for _ in range(repeat):
                t0 = time.perf_counter()
                answer = series(session, run, 1000, step_min, step_max)
                times.append(time.perf_counter() - t0)
            out[name] = {"points": answer["points"], "p50_ms": p(times, 0.5), "p95_ms": p(times, 0.95)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", choices=("sqlite", "postgresql"), default="sqlite")
    parser.add_argument("--batches", type=int, default=300)
    parser.add_argument("--channels", type=int, default=0, help="channels per record (0..4) in the store runs")
    parser.add_argument("--series-intervals", type=int, default=0, help="0: no read timing")
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--packscope", help="time the packscope package in this folder (see above)")
    args = parser.parse_args()
    out: dict[str, Any] = {"database": args.database, "load": os.getloadavg()[0]}
    out["backend"] = os.path.dirname(store_aggregates.__code__.co_filename)
    with scratch_database(args.database) as url:
        engine = make_engine(url)
        try:
            upgrade_schema(engine)
            make_session = make_sessionmaker(engine)
            modes = ("1 rank", "8 ranks", "8 senders", "1 record")
            out["store"] = [store(engine, make_session, mode, args.batches, args.channels) for mode in modes]
            if refresh is not None:
                kept_modes = ("1 record", "1 rank")
                out["kept_metrics"] = [kept_metrics_cost(engine, make_session, m, args.batches) for m in kept_modes]
            if args.series_intervals:
                t0 = time.perf_counter()
                fill(engine, make_session, "long", args.series_intervals, 1)
                fill(engine, make_session, "long-8", args.series_intervals // 8, 8)
                out["fill_s"] = round(time.perf_counter() - t0, 1)
                out["series_1_rank"] = reads(make_session, "long", args.series_intervals, args.repeat)
                out["series_8_ranks"] = reads(make_session, "long-8", args.series_intervals // 8, args.repeat)
        finally:
            engine.dispose()
    out["load_after"] = os.getloadavg()[0]
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
