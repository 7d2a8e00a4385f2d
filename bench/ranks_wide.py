"""A run of 16,384 ranks beside one of 8 (issue 39): the same intervals, in one database, served
by one uvicorn process, measured in alternation in one sitting so that the machine's load weighs
on both alike.

* build: every interval but the last stored in-process (ingest_together, one transaction per 1,000
  records of one interval); rows/s;
* ingest of one interval of all ranks: the last interval stored one record per transaction, as
  a job whose every rank posts its own record (the server's work per request, without HTTP);
* the run page's data: the requests the page makes before it is drawn (page_paths: catalogue,
  summary, series, length heatmap columns, last interval's histograms, steady sync sites, ledger,
  ranks, alerts), each timed and summed; the ranks endpoint's time and size;
  the per-rank matrix the endpoint read before the rank summaries (every sampled interval's raw
  rows), timed in-process;
* the CSV export of the whole run (rows/s);
* an alert judging round of the run (alerts/evaluate.decide: its reads and every rule), timed
  in-process with the runs' rounds in turn (4 x --repeat of them), beside the read of every rank's
  row of the same intervals (what a round read before the rounds read the rank summaries);
* with --browser, the run page in Debian's chromium: ms from navigation until the ranks panel is
  drawn (`ranks_panel`: both its charts, as the stills drawn before plotly.js loads or as plotly's),
  until plotly has drawn both (`ranks_interactive`), and until the first chart is drawn
  (browser_timing.py's conditions).

    python bench/ranks_wide.py --database sqlite --ranks 8,16384 --intervals 64 [--repeat 10] [--browser]

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
from datetime import UTC, datetime
from typing import Any

import httpx
from backend_scale import start_server, stop_server
from bench_data import record, run_body, scratch_database
from sqlalchemy import select

from packscope.backend.alerts.config import AlertConfig
from packscope.backend.alerts.evaluate import decide
from packscope.backend.alerts.inputs import read_intervals, run_row, with_rank_details
from packscope.backend.alerts.rules import Thresholds
from packscope.backend.ingest.batches import ingest_together
from packscope.backend.ingest.rows import parsed_records
from packscope.backend.reads import ranks as ranks_read
from packscope.backend.store.db import WRITES, make_engine, make_sessionmaker, upgrade_schema
from packscope.backend.store.models import Run
from packscope.backend.store.runs import get_run
from packscope.core.catalogue import MAX_BATCH

BUILD_BATCH = MAX_BATCH  # records a batch may hold (1,000)
STEPS = 10


def log(message: str) -> None:
    print(f"[ranks_wide {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Records:
    """Records of a run of `ranks` ranks: 64 templates (bench_data.record) renumbered, each rank's
    step time its own (0.4 s ± 2 %, one rank in 500 a straggler at +30 %), varying by interval."""

    def __init__(self, ranks: int) -> None:
        rng = random.Random(ranks)
        self.templates = [record(0, 0, rng) for _ in range(64)]
        self.base = [0.4 * (1.3 if r % 500 == 7 else 1.0) * (1 + 0.02 * rng.gauss(0, 1)) for r in range(ranks)]
        self.ranks = ranks

    def of(self, interval: int, rank: int) -> dict[str, Any]:
        wobble = 1 + 0.005 * ((interval * 7919 + rank * 104729) % 201 - 100) / 100
        gpu = self.base[rank] * wobble * STEPS
        t = self.templates[(interval + rank) % 64]
        return {
            **t,
            "interval": interval,
            "rank": rank,
            "first_step": interval * STEPS + 1,
            "last_step": (interval + 1) * STEPS,
            "wall_start": 1.7e9 + interval * 4,
            "wall_end": 1.7e9 + interval * 4 + gpu,
            "gpu_time_s": gpu,
            "host_time_s": gpu * 1.01,
        }


def build(engine: Any, run_id: str, records: Records, intervals: int) -> dict[str, Any]:
    writes = engine.execution_options(**{WRITES: True})
    rows, t0 = 0, time.perf_counter()
    for i in range(intervals - 1):
        for at in range(0, records.ranks, BUILD_BATCH):
            batch = [records.of(i, r) for r in range(at, min(at + BUILD_BATCH, records.ranks))]
            ingest_together(writes, [(run_id, parsed_records(batch))])
            rows += len(batch)
    built_s = time.perf_counter() - t0
    last = [parsed_records([records.of(intervals - 1, r)]) for r in range(records.ranks)]
    cpu0, t0 = time.process_time(), time.perf_counter()
    for parsed in last:
        ingest_together(writes, [(run_id, parsed)])
    one_s, one_cpu = time.perf_counter() - t0, time.process_time() - cpu0
    return {
        "build_rows": rows,
        "build_rows_per_s": rows / built_s if built_s else None,
        "one_interval_s": one_s,
        "one_interval_us_per_record": one_s / records.ranks * 1e6,
        "one_interval_cpu_us_per_record": one_cpu / records.ranks * 1e6,
    }


def page_paths(run_id: str, last_interval: int) -> dict[str, str]:
    """What the run page asks before it is drawn: run_early.js (catalogue, summary, series, length
    heatmap columns, ranks), run.js (sync sites of the steady window), ledger_run.js (the ledger),
    lengths.js (the last interval's histograms), run_alerts.js (the run's alerts)."""
    base = f"/api/v1/runs/{run_id}"
    return {
        "catalogue": "/api/v1/catalogue",
        "summary": base,
        "series": f"{base}/series?max_points=500",
        "heatmap_columns": f"{base}/histograms/over-time?columns=200",
        "histogram": f"{base}/histograms?interval={last_interval}",
        "sync_sites": f"{base}/sync-sites?limit=10&window=steady",
        "ledger": f"{base}/ledger",
        "ranks": f"{base}/ranks?max_points=200",
        "alerts": f"{base}/alerts",
    }


def median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * 1e3, 2)


def reads(http: httpx.Client, run_ids: list[str], last_interval: int, repeat: int) -> dict[str, dict[str, Any]]:
    """Every page path of every run, in alternation, `repeat` times."""
    times: dict[str, dict[str, list[float]]] = {r: {name: [] for name in page_paths(r, last_interval)} for r in run_ids}
    sizes: dict[str, dict[str, int]] = {r: {} for r in run_ids}
    for _ in range(repeat):
        for run_id in run_ids:
            for name, path in page_paths(run_id, last_interval).items():
                t0 = time.perf_counter()
                response = http.get(path)
                times[run_id][name].append(time.perf_counter() - t0)
                assert response.status_code == 200, (path, response.text[:200])
                sizes[run_id][name] = len(response.content)
    out = {}
    for run_id in run_ids:
        per = {name: median_ms(v) for name, v in times[run_id].items()}
        total = [sum(parts) for parts in zip(*times[run_id].values(), strict=True)]
        out[run_id] = {"page_ms_p50": median_ms(total), "ms_p50": per, "bytes": sizes[run_id]}
    return out


def raw_matrix_ms(make_session: Any, run_id: str, repeat: int) -> float:
    """The rows the ranks endpoint read before the rank summaries: every sampled interval's rows."""
    with make_session() as session:
        run = get_run(session, run_id)
        assert run is not None
        span = ranks_read.interval_range(session, run, None, None)
        assert span is not None
        points = ranks_read.strided(*span, 200)
        seconds = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            ranks_read._matrix(session, run, points)
            seconds.append(time.perf_counter() - t0)
    return median_ms(seconds)


def judging_ms(engine: Any, run_ids: list[str], repeat: int) -> dict[str, dict[str, float]]:
    """Alert judging rounds (alerts/evaluate.decide) in this process, the runs' rounds taken in
    turn so that the machine's load weighs on each alike: each run's first, which adds up every
    interval it reads, then the median of `repeat` rounds with nothing new, beside the read of
    every rank's row of the same intervals (what each round read before it read the rank
    summaries; 3 times)."""
    config = AlertConfig()
    out: dict[str, dict[str, float]] = {}
    with engine.connect() as connection:
        runs = {}
        for run_id in run_ids:
            run_pk = connection.execute(select(Run.id).where(Run.run_id == run_id)).scalar_one()
            run = run_row(connection, run_pk)
            assert run is not None
            runs[run_id] = (run_pk, run)
            t0 = time.perf_counter()
            decide(connection, run_pk, config, datetime.now(UTC))
            out[run_id] = {"first_round_ms": round((time.perf_counter() - t0) * 1e3, 2)}
        seconds: dict[str, list[float]] = {run_id: [] for run_id in run_ids}
        every_rank: dict[str, list[float]] = {run_id: [] for run_id in run_ids}
        for k in range(repeat):
            for run_id, (run_pk, run) in runs.items():
                t0 = time.perf_counter()
                decide(connection, run_pk, config, datetime.now(UTC))
                seconds[run_id].append(time.perf_counter() - t0)
                if k < 3:
                    t0 = time.perf_counter()
                    with_rank_details(connection, run_pk, read_intervals(connection, run, Thresholds()))
                    every_rank[run_id].append(time.perf_counter() - t0)
        connection.rollback()
    for run_id in run_ids:
        out[run_id] |= {
            "round_ms_p50": median_ms(seconds[run_id]),
            "every_rank_rows_ms_p50": median_ms(every_rank[run_id]),
        }
    return out


def csv_export(http: httpx.Client, run_id: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    with http.stream("GET", f"/api/v1/runs/{run_id}/intervals.csv") as response:
        assert response.status_code == 200
        lines = sum(chunk.count("\n") for chunk in response.iter_text())
    seconds = time.perf_counter() - t0
    return {"rows": lines - 1, "s": round(seconds, 3), "rows_per_s": round((lines - 1) / seconds)}


def browser(url: str, run_ids: list[str], repeat: int) -> dict[str, Any]:
    import browser_timing
    from playwright import sync_api

    drawn, still = browser_timing.DRAWN, browser_timing.STILL
    plots = [f"document.querySelector('#chart-rank_{chart} .plot')" for chart in ("heatmap", "spread")]
    shown = "!document.getElementById('ranks').hidden"
    # Drawn: both charts as stills (ranks_sketch.js, before plotly.js has loaded) or as plotly's.
    ranks_drawn = shown + "".join(f" && (p => {still}(p) || {drawn}(p))({plot})" for plot in plots)
    ranks_interactive = shown + "".join(f" && {drawn}({plot})" for plot in plots)
    conditions = {
        "first_chart": browser_timing.FIRST_CHART,
        "ranks_panel": ranks_drawn,
        "ranks_interactive": ranks_interactive,
    }
    out = {}
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(
            executable_path=browser_timing.CHROMIUM, args=browser_timing.CHROMIUM_ARGS
        )
        for run_id in run_ids:
            contexts = browser_timing.off_the_record(chromium)
            out[run_id] = browser_timing.page_times(contexts, f"{url}/runs/{run_id}", conditions, repeat)
        chromium.close()
    return out


def bench(database_url: str, args: argparse.Namespace) -> dict[str, Any]:
    engine = make_engine(database_url)
    upgrade_schema(engine)
    make_session = make_sessionmaker(engine)
    out: dict[str, Any] = {
        "database": args.database,
        "intervals": args.intervals,
        "cpus": os.cpu_count(),
        "load_avg": os.getloadavg(),
        "runs": {},
    }
    server, url = start_server(database_url)
    try:
        http = httpx.Client(base_url=url, timeout=600)
        run_ids = [f"wide-{n}" for n in args.ranks]
        for n, run_id in zip(args.ranks, run_ids, strict=True):
            assert http.post("/api/v1/runs", json=run_body(run_id)).status_code == 201
            log(f"building {run_id}: {n} ranks x {args.intervals} intervals")
            out["runs"][run_id] = {"ranks": n, **build(engine, run_id, Records(n), args.intervals)}
            log(f"built {run_id}: {out['runs'][run_id]}")
        log("reads")
        for run_id, measured in reads(http, run_ids, args.intervals - 1, args.repeat).items():
            out["runs"][run_id].update(measured)
        for run_id, judging in judging_ms(engine, run_ids, 4 * args.repeat).items():
            out["runs"][run_id]["alert_judging"] = judging
        for run_id in run_ids:
            out["runs"][run_id]["raw_matrix_ms_p50"] = raw_matrix_ms(make_session, run_id, 3)
            out["runs"][run_id]["csv"] = csv_export(http, run_id)
            log(f"{run_id}: csv {out['runs'][run_id]['csv']}")
        if args.browser:
            log("browser")
            for run_id, measured in browser(url, run_ids, args.browser_repeat).items():
                out["runs"][run_id]["browser"] = measured
        first, last = (out["runs"][r] for r in (run_ids[0], run_ids[-1]))
        out["widest_over_narrowest"] = {
            "page_ms_p50": last["page_ms_p50"] / first["page_ms_p50"],
            "ranks_ms_p50": last["ms_p50"]["ranks"] / first["ms_p50"]["ranks"],
            "ranks_bytes": last["bytes"]["ranks"] / first["bytes"]["ranks"],
            "sync_sites_ms_p50": last["ms_p50"]["sync_sites"] / first["ms_p50"]["sync_sites"],
            "ledger_ms_p50": last["ms_p50"]["ledger"] / first["ms_p50"]["ledger"],
            "one_interval_us_per_record": last["one_interval_us_per_record"] / first["one_interval_us_per_record"],
            "alert_round_ms_p50": last["alert_judging"]["round_ms_p50"] / first["alert_judging"]["round_ms_p50"],
        }
        out["load_avg_end"] = os.getloadavg()
        return out
    finally:
        stop_server(server)
        engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--ranks", default="8,16384", help="rank counts, comma-separated (narrowest first)")
    ap.add_argument("--intervals", type=int, default=64, help="intervals of each run")
    ap.add_argument("--repeat", type=int, default=10, help="timed repetitions of the page's reads")
    ap.add_argument("--browser", action="store_true", help="also time the run page in chromium")
    ap.add_argument("--browser-repeat", type=int, default=3)
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.ranks = [int(x) for x in args.ranks.split(",")]
    with scratch_database(args.database) as url:
        result = bench(url, args)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
