"""Two revisions of the backend side by side in one sitting: `backend_scale.py` of each (ingest
rows/s and server CPU per row, series p50/p95, run page, runs list, CSV rows/s) in interleaved
rounds on each database, and the CSV text of one run posted identically to both servers.

    python bench/heads.py [--before 69cdf22] [--databases sqlite,postgresql] [--intervals 1000000]
                          [--rounds 2] [--repeat 20] [--csv-intervals 1000000]

The before revision is checked out (git worktree) and installed (`pip --target`, no dependencies:
this environment's serve it) in a temporary folder; each revision runs its own `backend_scale.py`
against its own code. The rounds alternate which revision goes first, so that a machine that
slows down during the sitting weighs on both. The CSV check posts the same records (bench_data's,
seeded by batch) over HTTP to a server of each revision, then compares every column both CSVs
have, cell by cell. Prints one JSON object; progress goes to stderr.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
from backend_scale import start_server, stop_server
from bench_data import record, run_body, scratch_database

from packscope.core.catalogue import MAX_BATCH

ROOT = Path(__file__).resolve().parent.parent
SENDERS = 4  # threads posting the CSV check's records


def log(message: str) -> None:
    print(f"[heads {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def install_before(rev: str, tmp: Path) -> tuple[Path, Path]:
    """(its checkout, the folder holding it installed as the packscope package)."""
    tree, pkg = tmp / "tree", tmp / "pkg"
    subprocess.run(
        ["git", "-C", str(ROOT), "worktree", "add", "--detach", "-f", str(tree), rev], check=True, stdout=sys.stderr
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "-q",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(pkg),
            str(tree),
        ],
        check=True,
        cwd=tmp,
        stdout=sys.stderr,
    )
    return tree, pkg


def scale(tree: Path, pkg: Path | None, database: str, args: argparse.Namespace) -> dict[str, Any]:
    """One `backend_scale.py` run of the revision in `tree` (installed in `pkg`; None: this checkout)."""
    command = [sys.executable, str(tree / "bench" / "backend_scale.py"), "--database", database]
    command += ["--intervals", str(args.intervals), "--repeat", str(args.repeat), "--batches", str(args.batches)]
    env = {**os.environ, "PYTHONPATH": str(pkg)} if pkg else dict(os.environ)
    done = subprocess.run(command, env=env, cwd=tempfile.gettempdir() if pkg else ROOT, capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"{command} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout)


def figures(result: dict[str, Any]) -> dict[str, float]:
    """The figures of docs/BENCHMARKS.md's goals from one backend_scale result."""
    one, eight = result["ingest"]
    big = result["runs"][-1]
    return {
        "ingest_rows_per_s_1": one["rows_per_s"],
        "ingest_rows_per_s_8": eight["rows_per_s"],
        "server_cpu_us_per_row_1": one["server_cpu_us_per_row"],
        "server_cpu_us_per_row_8": eight["server_cpu_us_per_row"],
        "series_ms_p50": big["series_ms_p50"],
        "series_ms_p95": big["series_ms_p95"],
        "run_page_ms_p50": big["run_page_ms_p50"],
        "sync_sites_ms_p50": big["sync_sites_ms_p50"],
        "runs_list_ms_p50": result["runs_list"]["ms_p50"],
        "csv_rows_per_s": big["csv_rows_per_s"],
    }


def side_by_side(runs: dict[str, list[dict[str, float]]]) -> dict[str, Any]:
    """Per figure: each revision's values and median, and after ÷ before of the medians."""
    out: dict[str, Any] = {}
    for name in runs["before"][0]:
        before = [r[name] for r in runs["before"]]
        after = [r[name] for r in runs["after"]]
        out[name] = {
            "before": before,
            "after": after,
            "after_over_before": round(statistics.median(after) / statistics.median(before), 4),
        }
    return out


def post_records(url: str, run_id: str, intervals: int) -> None:
    """`intervals` records of one rank, in batches of MAX_BATCH, each batch seeded by its index."""

    def post(start: int) -> None:
        rng = random.Random(start)
        body = json.dumps(
            {"intervals": [record(i, 0, rng) for i in range(start, min(start + MAX_BATCH, intervals))]}
        ).encode()
        with httpx.Client(base_url=url, timeout=300) as http:
            while True:
                r = http.post(
                    f"/api/v1/runs/{run_id}/intervals", content=body, headers={"Content-Type": "application/json"}
                )
                if r.status_code in (429, 503):  # shed load: retry as the agent would
                    time.sleep(0.05)
                    continue
                r.raise_for_status()
                return

    with ThreadPoolExecutor(SENDERS) as pool:
        list(pool.map(post, range(0, intervals, MAX_BATCH)))


def csv_columns(url: str, run_id: str) -> tuple[list[str], dict[str, str], int]:
    """(header, sha256 of each column's cells in order, rows) of the run's CSV."""
    with (
        httpx.Client(base_url=url, timeout=600) as http,
        http.stream("GET", f"/api/v1/runs/{run_id}/intervals.csv") as r,
    ):
        r.raise_for_status()
        reader = csv.reader(r.iter_lines())
        header = next(reader)
        digests = [hashlib.sha256() for _ in header]
        rows = 0
        for row in reader:
            rows += 1
            for digest, cell in zip(digests, row, strict=True):
                digest.update(cell.encode() + b"\x1f")
    return header, {name: d.hexdigest() for name, d in zip(header, digests, strict=True)}, rows


def csv_of(pkg: Path | None, database: str, intervals: int) -> tuple[list[str], dict[str, str], int, float]:
    with scratch_database(database) as db_url:
        server, url = start_server(db_url, 1, str(pkg) if pkg else None)
        try:
            assert httpx.post(f"{url}/api/v1/runs", json=run_body("csv-check")).status_code == 201
            t0 = time.perf_counter()
            post_records(url, "csv-check", intervals)
            post_s = time.perf_counter() - t0
            header, digests, rows = csv_columns(url, "csv-check")
            return header, digests, rows, post_s
        finally:
            stop_server(server)


def csv_check(pkg: Path, database: str, intervals: int) -> dict[str, Any]:
    log(f"CSV check on {database}: before")
    h0, d0, n0, s0 = csv_of(pkg, database, intervals)
    log(f"CSV check on {database}: after")
    h1, d1, n1, s1 = csv_of(None, database, intervals)
    common = [name for name in h0 if name in d1]
    return {
        "rows": [n0, n1],
        "posted_rows_per_s": [round(intervals / s0), round(intervals / s1)],
        "common_columns": len(common),
        "columns_only_before": [name for name in h0 if name not in d1],
        "columns_only_after": [name for name in h1 if name not in d0],
        "common_columns_in_the_same_order": [n for n in h1 if n in d0] == common,
        "columns_that_differ": [name for name in common if d0[name] != d1[name]],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--before", default="69cdf22", help="the revision to compare this checkout with")
    ap.add_argument("--databases", default="sqlite,postgresql")
    ap.add_argument("--intervals", type=int, default=1_000_000, help="the read benchmarks' run size")
    ap.add_argument("--rounds", type=int, default=2, help="backend_scale runs of each revision per database")
    ap.add_argument("--repeat", type=int, default=20, help="timed repetitions per read (backend_scale --repeat)")
    ap.add_argument(
        "--batches",
        type=int,
        default=512,
        help="batches of 64 rows per ingest measurement (backend_scale --batches; "
        "its default of 64 is 4,096 rows, a few dozen ticks of the server's CPU clock)",
    )
    ap.add_argument("--csv-intervals", type=int, default=1_000_000, help="the CSV check's run size; 0: no check")
    args = ap.parse_args()
    databases = args.databases.split(",")
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    out: dict[str, Any] = {"before": args.before, "after": commit.stdout.strip(), "load_avg_start": os.getloadavg()}
    with tempfile.TemporaryDirectory() as tmp:
        tree, pkg = install_before(args.before, Path(tmp))
        try:
            for database in databases:
                runs: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
                for i in range(args.rounds):
                    order = ["before", "after"] if i % 2 == 0 else ["after", "before"]
                    for head in order:
                        log(f"{database} round {i + 1}/{args.rounds}: {head}")
                        result = (
                            scale(tree, pkg, database, args) if head == "before" else scale(ROOT, None, database, args)
                        )
                        runs[head].append(figures(result))
                out[database] = side_by_side(runs)
                if args.csv_intervals:
                    out[database]["csv_text"] = csv_check(pkg, database, args.csv_intervals)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False, stdout=sys.stderr
            )
    out["load_avg_end"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
