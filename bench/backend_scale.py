"""The backend at scale: ingest rate and server CPU per row, and read latency on large runs.

* ingest: interval rows/s through a real uvicorn server on 127.0.0.1, batches of 64, with 1 and
  with 8 concurrent senders (8 ranks of one run), and the server's CPU time per row (from
  /proc/<pid>/stat before and after), measured after --warmup batches to another run (a served
  process is warm); and in this process, the CPU time per row of validating
  raw batches (rows.parse) and of storing them (ingest_together, as the route does), apart from HTTP;
* reads on runs of --intervals sizes (rows generated in-process through the ingest function,
  not over HTTP): series (max_points=1000) p50/p95, run page data (summary + series + sync sites)
  p50, sync sites p50, runs list of 200 runs p50, CSV export rows/s.

    python bench/backend_scale.py --database sqlite|postgresql [--intervals 10000,100000] [--batches 64] [--workers 1]

PostgreSQL: a scratch database on 127.0.0.1:5432 (user postgres, trust auth), dropped afterwards.
Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from bench_data import record, run_body, scratch_database

from packscope.backend.ingest.batches import ingest_batch, ingest_together
from packscope.backend.ingest.rows import parse
from packscope.backend.store.db import WRITES, make_engine, make_sessionmaker, upgrade_schema
from packscope.backend.store.runs import get_run
from packscope.core.ports import free_port

BATCH = 64


def store_renumbered(make_session: Any, run_id: str, template: list[Any], intervals: int) -> float:
    """Store `intervals` records for the stored run `run_id` in-process through ingest_batch, in
    batches of 1000: the validated `template` records re-numbered in turn; seconds taken."""
    t0 = time.perf_counter()
    with make_session() as session:
        run = get_run(session, run_id)
        assert run is not None
        for start in range(0, intervals, 1000):
            batch = [
                {**template[i % len(template)], "interval": i, "first_step": i * 10 + 1, "last_step": i * 10 + 10}
                for i in range(start, min(start + 1000, intervals))
            ]
            ingest_batch(session, run, batch)
    return time.perf_counter() - t0


def fill_run(make_session: Any, http: httpx.Client, run_id: str, intervals: int) -> float:
    """A new run of `intervals` records (64 distinct ones re-numbered), stored in-process; seconds taken."""
    assert http.post("/api/v1/runs", json=run_body(run_id)).status_code == 201
    rng = random.Random(run_id)
    template = [record(i, 0, rng) for i in range(64)]
    return store_renumbered(make_session, run_id, template, intervals)


def ingest_in_process(engine: Any, http: httpx.Client, batches: int) -> dict[str, Any]:
    """CPU seconds per row of validating raw batches of 64 (rows.parse) and storing them
    (ingest_together, one transaction each), in this process: what the route spends per row without
    HTTP, and steadier than wall time on a busy machine."""
    run_id = "in-process"
    assert http.post("/api/v1/runs", json=run_body(run_id)).status_code == 201
    rng = random.Random(2)
    bodies = [
        json.dumps({"intervals": [record(b * BATCH + i, 0, rng) for i in range(BATCH)]}).encode()
        for b in range(batches)
    ]
    writes = engine.execution_options(**{WRITES: True})
    cpu0 = time.process_time()
    validated = [parse(body) for body in bodies]
    cpu1 = time.process_time()
    for parsed in validated:
        assert ingest_together(writes, [(run_id, parsed)])[0] is not None
    cpu2 = time.process_time()
    rows = batches * BATCH
    return {
        "rows": rows,
        "validate_cpu_us_per_row": (cpu1 - cpu0) / rows * 1e6,
        "store_cpu_us_per_row": (cpu2 - cpu1) / rows * 1e6,
    }


def cpu_seconds(pid: int) -> float:
    """CPU seconds of the server process and its worker processes (uvicorn --workers)."""
    pids, seen, total = [pid], 0, 0
    while seen < len(pids):
        with open(f"/proc/{pids[seen]}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])
        for children in Path(f"/proc/{pids[seen]}/task").glob("*/children"):
            pids += [int(child) for child in children.read_text().split()]
        seen += 1
    return total / os.sysconf("SC_CLK_TCK")


def run_senders(pid: int, senders: int, send: Callable[[int], None]) -> tuple[float, float]:
    """`send(rank)` for every rank in `senders` threads at once: (wall seconds, CPU seconds of the
    server `pid` meanwhile)."""
    threads = [threading.Thread(target=send, args=(rank,)) for rank in range(senders)]
    cpu0, t0 = cpu_seconds(pid), time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, cpu_seconds(pid) - cpu0


def ingest(url: str, pid: int, senders: int, batches: int, run_id: str) -> dict[str, Any]:
    """`senders` threads, one rank each, post `batches` batches of 64 consecutive intervals."""
    http = httpx.Client(base_url=url, timeout=60)
    assert http.post("/api/v1/runs", json=run_body(run_id)).status_code == 201
    rng = random.Random(1)
    bodies = {
        rank: [
            json.dumps({"intervals": [record(b * BATCH + i, rank, rng) for i in range(BATCH)]}).encode()
            for b in range(batches)
        ]
        for rank in range(senders)
    }
    errors: list[str] = []

    def send(rank: int) -> None:
        with httpx.Client(base_url=url, timeout=60) as client:
            for body in bodies[rank]:
                while True:
                    r = client.post(
                        f"/api/v1/runs/{run_id}/intervals", content=body, headers={"Content-Type": "application/json"}
                    )
                    if r.status_code in (429, 503):  # shed load: retry as the agent would
                        time.sleep(float(r.headers.get("retry-after", "0.05")) / 10)
                        continue
                    if r.status_code != 200:
                        errors.append(r.text[:200])
                    break

    seconds, cpu = run_senders(pid, senders, send)
    rows = senders * batches * BATCH
    stored = http.get(f"/api/v1/runs/{run_id}").json()["records"]
    return {
        "senders": senders,
        "rows": rows,
        "stored": stored,
        "errors": len(errors),
        "rows_per_s": rows / seconds,
        "server_cpu_us_per_row": cpu / rows * 1e6,
    }


def timed(http: httpx.Client, paths: list[str], repeat: int) -> list[float]:
    out = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        for path in paths:
            response = http.get(path)
            assert response.status_code == 200, (path, response.text[:200])
        out.append(time.perf_counter() - t0)
    return out


def p(values: list[float], q: float) -> float:
    return round(sorted(values)[min(len(values) - 1, int(q * len(values)))] * 1000, 2)


def reads(http: httpx.Client, run_id: str, intervals: int, repeat: int) -> dict[str, Any]:
    base = f"/api/v1/runs/{run_id}"
    series = timed(http, [f"{base}/series?max_points=1000"], repeat)
    page = timed(http, [base, f"{base}/series?max_points=1000", f"{base}/sync-sites"], repeat)
    recent = timed(http, [f"{base}/series?max_points=1000&step_min={intervals * 10 - 500}"], repeat)
    sites = timed(http, [f"{base}/sync-sites"], repeat)
    t0 = time.perf_counter()
    with http.stream("GET", f"{base}/intervals.csv") as response:
        lines = sum(chunk.count("\n") for chunk in response.iter_text())
    csv_s = time.perf_counter() - t0
    return {
        "intervals": intervals,
        "series_ms_p50": p(series, 0.5),
        "series_ms_p95": p(series, 0.95),
        "series_recent_ms_p50": p(recent, 0.5),
        "run_page_ms_p50": p(page, 0.5),
        "sync_sites_ms_p50": p(sites, 0.5),
        "csv_rows": lines - 1,
        "csv_rows_per_s": (lines - 1) / csv_s,
    }


def wait_until_serving(server: subprocess.Popen[bytes], url: str) -> None:
    """Return once the server at `url` answers; exit if it died or did not answer within 60 s."""
    deadline = time.monotonic() + 60
    while True:
        try:
            httpx.get(f"{url}/api/v1/catalogue", timeout=1).raise_for_status()
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit("the server did not start") from None
            time.sleep(0.2)


def stop_server(server: subprocess.Popen[bytes]) -> None:
    """Ends a server; uvicorn waits for the requests in flight (a closed page's heavy ones go on
    being answered on a busy machine), so past 30 s it is killed: a bench's figures are never lost
    to a slow shutdown."""
    server.terminate()
    try:
        server.wait(30)
    except subprocess.TimeoutExpired:
        server.kill()
        server.wait(10)


def start_server(
    database_url: str, workers: int = 1, pythonpath: str | None = None, prelude: str = ""
) -> tuple[subprocess.Popen[bytes], str]:
    """A uvicorn server on a free port (`prelude`: Python run before the app is built, e.g. to swap
    a module for a before/after comparison)."""
    port = free_port()
    code = (
        f"{prelude}import importlib.util, uvicorn\n"
        # A checkout from before the backend's layer folders (heads.py's before) has its app module at
        # the backend's root.
        "old = importlib.util.find_spec('packscope.backend.app') is not None\n"
        "app, settings = (importlib.import_module(f'packscope.backend.{m}') for m in\n"
        "    (('app', 'settings') if old else ('server.app', 'http.settings')))\n"
        f"uvicorn.run(app.create_app(settings.Settings(database_url={database_url!r}, ingest_token=None, "
        f"read_token=None)), host='127.0.0.1', port={port}, log_level='warning')"
    )
    command = [sys.executable, "-c", code]
    if workers > 1:  # as deployed: `packscope serve` with worker processes
        command = [sys.executable, "-m", "packscope", "serve", "--port", str(port), "--workers", str(workers)]
        command += ["--database-url", database_url, "--no-access-log"]
    env = {**os.environ, "PACKSCOPE_INGEST_TOKEN": "", "PACKSCOPE_READ_TOKEN": ""}
    if pythonpath:  # another checkout's server (a before/after comparison), run outside this one
        env["PYTHONPATH"] = pythonpath
    server = subprocess.Popen(command, env=env, cwd=tempfile.gettempdir() if pythonpath else None)
    url = f"http://127.0.0.1:{port}"
    wait_until_serving(server, url)
    return server, url


def bench(database_url: str, args: argparse.Namespace) -> dict[str, Any]:
    engine = make_engine(database_url)
    if not args.server_pythonpath:  # another checkout's server migrates to its own head
        upgrade_schema(engine)
    make_session = make_sessionmaker(engine)
    server, url = start_server(database_url, args.workers, args.server_pythonpath)
    try:
        http = httpx.Client(base_url=url, timeout=300)
        out: dict[str, Any] = {
            "database": args.database,
            "workers": args.workers,
            "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(),
        }
        if args.warmup:  # a served process is warm: first calls (caches, statements) are not the rate
            out["warmup"] = ingest(url, server.pid, 8, max(1, args.warmup // 8), "warm-up")
        out["ingest"] = [ingest(url, server.pid, n, args.batches // n, f"ingest-{n}") for n in (1, 8)]
        if args.ingest_only:
            return out
        out["ingest_in_process"] = ingest_in_process(engine, http, args.batches)
        out["runs"] = []
        for n in args.intervals:
            fill_s = fill_run(make_session, http, f"big-{n}", n)
            out["runs"].append({**reads(http, f"big-{n}", n, args.repeat), "fill_in_process_rows_per_s": n / fill_s})
        for i in range(200 - len(args.intervals) - 2):
            http.post("/api/v1/runs", json=run_body(f"small-{i}"))
        runs_list = timed(http, ["/api/v1/runs"], args.repeat)
        out["runs_list"] = {"runs": len(http.get("/api/v1/runs").json()["runs"]), "ms_p50": p(runs_list, 0.5)}
        out["load_avg_end"] = os.getloadavg()
        return out
    finally:
        stop_server(server)
        engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--intervals", default="10000,100000", help="run sizes for the read benchmarks, comma-separated")
    ap.add_argument("--batches", type=int, default=64, help="batches of 64 rows per ingest measurement")
    ap.add_argument("--repeat", type=int, default=20, help="timed repetitions per read")
    ap.add_argument("--workers", type=int, default=1, help="server processes (>1: `packscope serve --workers`)")
    ap.add_argument(
        "--warmup",
        type=int,
        default=16,
        help="batches posted (8 senders, another run) before the ingest is measured; 0 for none (before 2026-11-30 "
        "evening there was none)",
    )
    ap.add_argument("--ingest-only", action="store_true", help="only the ingest over HTTP")
    ap.add_argument(
        "--server-pythonpath",
        default=None,
        help="run the server with this PYTHONPATH (a directory holding another checkout as the packscope "
        "package), for before/after comparisons of the ingest over HTTP in one sitting",
    )
    args = ap.parse_args()
    # A `timeout` or Ctrl-C still stops the server and drops the scratch database (finally clauses).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args.intervals = [int(x) for x in args.intervals.split(",")]
    if args.server_pythonpath and not args.ingest_only:
        ap.error("--server-pythonpath measures the ingest over HTTP only: add --ingest-only")
    with scratch_database(args.database) as url:
        result = bench(url, args)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
