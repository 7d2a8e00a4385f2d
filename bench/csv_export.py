"""CSV export benchmark: rows/s and memory of `GET /api/v1/runs/{run_id}/intervals.csv`.

Fills one run of --intervals rows in-process through ingest_batch (as bench/backend_scale.py's
fill_run does; records with channel_loss/channel_tokens and some missing optional readings), then
exports it --repeat times each way:

* in-process: csv_export.csv_bytes(session, run) drained in this process; rows/s, this process's
  CPU seconds with those of any child process the export started and ended (also apart, as
  children_cpu_s: an export code that reads with a second process), on PostgreSQL the server
  process's (which computes and formats the rows), and the growth of this process's peak RSS over
  the export (VmHWM, reset through /proc/self/clear_refs first);
* over HTTP: a real uvicorn server in a subprocess, the body streamed with httpx (iter_bytes);
  rows/s, the server's CPU seconds (with those of its ended children) and the growth of the
  server's peak RSS during the export.

One more in-process export, untimed, gives the peak of Python allocations (tracemalloc) and the
SHA-256 of the whole text: the same fill gives the same digest on SQLite and PostgreSQL when both
write the same CSV.

    python bench/csv_export.py --database sqlite|postgresql [--intervals 1000000] [--repeat 3] [--analyze]
        [--real-magnitudes]
    git show HEAD:backend/reads/csv_export.py > /tmp/old.py    # the committed export
    python bench/csv_export.py --database sqlite --baseline /tmp/old.py --repeat 3

With --baseline (repeatable: baseline, baseline2, ...), every code exports the same filled run,
interleaved (baseline in-process, its server over HTTP, ..., current in-process, its server over
HTTP, then again): before/after figures from the same moments of a shared machine. --analyze
runs ANALYZE after the fill (PostgreSQL plans with statistics, as a run has some time after it was
written; without, the run is new to the planner).

PostgreSQL: a scratch database on 127.0.0.1:5432 (user postgres, trust auth), dropped afterwards.
Prints one JSON object. Goal (issue 8): >= 200,000 rows/s both ways on both databases, with a
peak RSS growth that does not grow with the run's length.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import resource
import statistics
import time
import tracemalloc
import types
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import numpy as np
from backend_scale import cpu_seconds, start_server, stop_server, store_renumbered
from bench_data import record, run_body, scratch_database

from packscope.backend.reads import csv_export
from packscope.backend.store.db import make_engine, make_sessionmaker, upgrade_schema
from packscope.backend.store.runs import get_run

RUN_ID = "csv-bench"


def templates(count: int, real_magnitudes: bool = False) -> list[Any]:
    """`count` validated records with varied numbers; a few miss their optional readings (NULL cells).
    real_magnitudes: FLOPs of a 70B-parameter model (6 N per token, ~1.4e17 an interval: past 2^54,
    where float8out's digits need exact integer work) and whole-byte GPU memory readings (~4e10,
    fixed notation past Arrow's), instead of bench_data's 1.0 FLOPs and no memory reading."""
    rng = random.Random(8)
    raw = []
    for i in range(count):
        r = record(i, 0, rng)
        if real_magnitudes:
            flops = 6 * 70e9 * r["tokens"] * rng.uniform(1.0, 1.1)
            r["flops_bshd"], r["flops_thd"], r["flops_useful"] = flops * 1.2, flops * 1.1, flops
            r["gpu"]["sm_clock_mhz"] = float(rng.randint(1700, 1980))
            r["gpu"]["mem_used_bytes"] = float(rng.randint(30, 80) * 2**30 + rng.randint(0, 2**20))
        r["channel_loss"] = {"code": rng.uniform(1, 3), "web, en": rng.uniform(1, 3)}
        r["channel_tokens"] = {"code": rng.randint(1, 9999), "web, en": rng.randint(1, 9999)}
        if i % 7 == 3:
            r["loss"] = None
            r["gpu"] = None
            del r["channel_loss"], r["channel_tokens"]
        if i % 11 == 5:
            r["gpu_time_s"] = 0.0  # rates undefined: empty derived cells
        raw.append(r)
    return raw


def fill(make_session: Callable[[], Any], intervals: int, real_magnitudes: bool = False) -> float:
    """Store `intervals` records of RUN_ID (64 distinct records re-numbered); seconds."""
    return store_renumbered(make_session, RUN_ID, templates(64, real_magnitudes), intervals)


def peak_kib(pid: int | str = "self") -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:"))


def reset_peak(pid: int | str = "self") -> None:
    with open(f"/proc/{pid}/clear_refs", "w") as refs:
        refs.write("5")  # the peak RSS (VmHWM) starts again from the current RSS


def in_process(make_session: Callable[[], Any], export: Any) -> dict[str, Any]:
    with make_session() as session:
        run = get_run(session, RUN_ID)
        assert run is not None
        driver = session.connection().connection.driver_connection
        backend = getattr(getattr(driver, "info", None), "backend_pid", None)  # PostgreSQL's server process
        reset_peak()
        before = peak_kib()
        rows, size = -1, 0
        db0 = cpu_seconds(backend) if backend else 0.0
        t0, cpu0, children0 = time.perf_counter(), time.process_time(), children_cpu_seconds()
        for piece in export_pieces(export, session, run):
            rows += newlines(piece)
            size += len(piece)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        children = children_cpu_seconds() - children0
        growth = peak_kib() - before
        out = {
            "rows": rows,
            "bytes": size,
            "seconds": seconds,
            "cpu_s": cpu + children,
            "children_cpu_s": children,
            "peak_rss_growth_kib": growth,
        }
        if backend:
            out["db_server_cpu_s"] = cpu_seconds(backend) - db0  # COPY's work: the derived columns and formatting
        return out


def digest_and_allocations(make_session: Callable[[], Any], export: Any) -> dict[str, Any]:
    """One untimed export: the SHA-256 of its text and the peak of Python allocations during it."""
    sha = hashlib.sha256()
    pieces = 0
    with make_session() as session:
        run = get_run(session, RUN_ID)
        assert run is not None
        tracemalloc.start()
        for piece in export_pieces(export, session, run):
            sha.update(piece)
            pieces += 1
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    return {"sha256": sha.hexdigest(), "pieces": pieces, "tracemalloc_peak_kib": peak // 1024}


def children_cpu_seconds() -> float:
    """CPU seconds of this process's children that have ended (waited for)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def server_cpu_seconds(pid: int) -> float:
    """The server's CPU seconds with those of its children that have ended (cutime, cstime)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return cpu_seconds(pid) + (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def over_http(url: str, pid: int) -> dict[str, Any]:
    with httpx.Client(base_url=url, timeout=600) as http:
        reset_peak(pid)
        before, cpu0 = peak_kib(pid), server_cpu_seconds(pid)
        rows, size, chunks = -1, 0, 0
        t0 = time.perf_counter()
        with http.stream("GET", f"/api/v1/runs/{RUN_ID}/intervals.csv") as response:
            assert response.status_code == 200, response.read()[:200]
            for chunk in response.iter_raw():
                rows += chunk.count(b"\n")
                size += len(chunk)
                chunks += 1
        seconds = time.perf_counter() - t0
        return {
            "rows": rows,
            "bytes": size,
            "chunks_received": chunks,
            "seconds": seconds,
            "server_cpu_s": server_cpu_seconds(pid) - cpu0,
            "server_peak_rss_growth_kib": peak_kib(pid) - before,
        }


def summary(runs: list[dict[str, Any]], cpu_key: str) -> dict[str, Any]:
    """Rows per wall second (what a client sees; on a shared machine it moves with the load) and
    rows per CPU second of the exporting process (steadier: what the export costs)."""
    rates = [r["rows"] / r["seconds"] for r in runs]
    per_cpu = [r["rows"] / r[cpu_key] for r in runs if r[cpu_key] > 0]
    return {
        "rows_per_s_median": round(statistics.median(rates)),
        "rows_per_s_min": round(min(rates)),
        "rows_per_s_max": round(max(rates)),
        "rows_per_cpu_s_median": round(statistics.median(per_cpu)) if per_cpu else None,
        "runs": runs,
    }


def baseline_export(path: str) -> tuple[Any, str]:
    """An older backend/reads/csv_export.py (for before/after numbers in one sitting) as a module of
    its own, and the code that makes the server's CSV route (backend/http/csv_streams.py, which writes
    csv_export.csv_bytes's pieces) use it. A module without csv_bytes (before 2026-12-03) yields
    text, which the server of its time encoded piece by piece: so does its stand-in here."""
    path = os.path.abspath(path)
    module = types.ModuleType("baseline_csv_export")
    module.__file__ = path
    with open(path) as source:
        exec(compile(source.read(), path, "exec"), module.__dict__)
    prelude = (
        "import types, packscope.backend.reads.csv_export as _current; "
        f"_old = types.ModuleType('baseline_csv_export'); _old.__file__ = {path!r}; "
        f"exec(compile(open({path!r}).read(), {path!r}, 'exec'), _old.__dict__); "
        "_current.csv_bytes = getattr(_old, 'csv_bytes', None) "
        "or (lambda session, run: (text.encode() for text in _old.csv_text(session, run))); "
    )
    return module, prelude


def export_pieces(export: Any, session: Any, run: Any) -> Iterator[Any]:
    """The export's pieces as the server writes them: csv_bytes's, or (an older module) its text encoded."""
    if hasattr(export, "csv_bytes"):
        return export.csv_bytes(session, run)
    return (text.encode() for text in export.csv_text(session, run))


def newlines(piece: Any) -> int:
    return int(np.count_nonzero(np.frombuffer(piece, np.uint8) == 10))  # bytes or a memoryview


def analyze(database_url: str) -> None:
    """Fresh planner statistics, as autovacuum gives a run some time after it was written."""
    engine = make_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.exec_driver_sql("ANALYZE")
    finally:
        engine.dispose()


def bench(database_url: str, args: argparse.Namespace) -> dict[str, Any]:
    engine = make_engine(database_url)
    upgrade_schema(engine)
    make_session = make_sessionmaker(engine)
    codes: dict[str, tuple[Any, str]] = {}
    for at, path in enumerate(args.baseline or []):
        codes[f"baseline{at + 1 if at else ''}"] = baseline_export(path)
    codes["current"] = (csv_export, "")
    servers = {name: start_server(database_url, prelude=prelude) for name, (_, prelude) in codes.items()}
    try:
        url = next(iter(servers.values()))[1]
        assert httpx.post(f"{url}/api/v1/runs", json=run_body(RUN_ID)).status_code == 201
        out: dict[str, Any] = {
            "database": args.database,
            "intervals": args.intervals,
            "cpus": os.cpu_count(),
            "load_avg": os.getloadavg(),
            "baseline_code": args.baseline,
            "analyze": args.analyze,
        }
        out["real_magnitudes"] = args.real_magnitudes
        out["fill_rows_per_s"] = round(args.intervals / fill(make_session, args.intervals, args.real_magnitudes))
        if args.analyze:
            analyze(database_url)
        ways: dict[str, list[dict[str, Any]]] = {
            f"{code}_{way}": [] for code in codes for way in ("in_process", "http")
        }
        for _ in range(args.repeat):  # interleaved, so every code and way sees the same moments of a busy machine
            for code, (module, _) in codes.items():
                ways[f"{code}_in_process"].append(in_process(make_session, module))
                ways[f"{code}_http"].append(over_http(servers[code][1], servers[code][0].pid))
        for way, runs in ways.items():
            assert all(r["rows"] == args.intervals for r in runs), (way, [r["rows"] for r in runs])
            out[way] = summary(runs, "cpu_s" if way.endswith("in_process") else "server_cpu_s")
        for code, (module, _) in codes.items():
            out[f"{code}_check"] = digest_and_allocations(make_session, module)
        out["load_avg_end"] = os.getloadavg()
        return out
    finally:
        for server, _ in servers.values():
            stop_server(server)
        engine.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--intervals", type=int, default=1_000_000, help="rows of the exported run")
    ap.add_argument("--repeat", type=int, default=3, help="timed exports each way")
    ap.add_argument(
        "--baseline",
        metavar="FILE",
        action="append",
        help="also export with this csv_export.py, interleaved with the current one on the same data"
        " (e.g. `git show REV:backend/reads/csv_export.py > old.py`); repeatable",
    )
    ap.add_argument("--analyze", action="store_true", help="ANALYZE after the fill (planner statistics of the run)")
    ap.add_argument(
        "--real-magnitudes",
        action="store_true",
        help="FLOPs of a 70B model (~1.4e17 an interval) and GPU memory readings in bytes (see templates)",
    )
    args = ap.parse_args()
    with scratch_database(args.database) as url:
        result = bench(url, args)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
