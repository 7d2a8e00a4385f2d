"""Burst benchmark: N senders (a job's ranks) each post a batch of records every period, all at
the same instant, against a real `packscope serve` in a subprocess. Prints JSON.

A 503/429 answer is retried after its Retry-After (plus jitter) and counted, not an error.
Goal: no errors, p99 latency under 1 s, rows stored == records acknowledged.

    python bench/burst.py --seconds 20                    # PostgreSQL on 127.0.0.1:5432
    python bench/burst.py --database sqlite --seconds 20
"""

import argparse
import asyncio
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "backend"))
from conftest import make_record, run_body  # type: ignore[import-not-found]  # the tests' record builder

PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def renumbered(record: dict[str, Any], interval: int) -> dict[str, Any]:
    steps = record["steps"]
    return {**record, "interval": interval, "first_step": interval * steps + 1, "last_step": (interval + 1) * steps}


async def sender(
    rank: int, http: httpx.AsyncClient, args: argparse.Namespace, t0: float, stats: dict[str, Any]
) -> None:
    rng = random.Random(rank)
    # Records are made once and renumbered per batch: making them costs more CPU than the server
    # spends storing them, and the benchmark must measure the server, not its own client.
    template = [make_record(i, rng, rank=rank) for i in range(args.records)]
    for tick in range(int(args.seconds / args.period)):
        await asyncio.sleep(max(0.0, t0 + tick * args.period - time.monotonic()))  # the shared boundary
        body = {"intervals": [renumbered(r, tick * args.records + i) for i, r in enumerate(template)]}
        stats["offered"] += args.records
        while True:
            started = time.monotonic()
            try:
                answer = await http.post("/api/v1/runs/bench/intervals", json=body)
            except httpx.HTTPError as exc:
                stats["errors"].append(type(exc).__name__)
                break
            stats["latencies"].append(time.monotonic() - started)
            if answer.status_code in (429, 503):
                stats["shed"] += 1
                await asyncio.sleep(int(answer.headers.get("retry-after", "1")) + rng.uniform(0, 0.5))
                continue
            if answer.status_code != 200:
                stats["errors"].append(answer.status_code)
            else:
                stats["acknowledged"] += answer.json()["accepted"]
            break


async def drive(url: str, args: argparse.Namespace) -> dict[str, Any]:
    stats: dict[str, Any] = {"offered": 0, "acknowledged": 0, "shed": 0, "errors": [], "latencies": []}
    limits = httpx.Limits(max_connections=args.senders, max_keepalive_connections=args.senders)
    async with httpx.AsyncClient(base_url=url, timeout=30, limits=limits) as http:
        assert (await http.post("/api/v1/runs", json=run_body("bench"))).status_code in (200, 201)
        t0 = time.monotonic() + 0.5
        await asyncio.gather(*(sender(rank, http, args, t0, stats) for rank in range(args.senders)))
        stats["elapsed_s"] = time.monotonic() - t0
        csv = await http.get("/api/v1/runs/bench/intervals.csv")
        stats["stored"] = len(csv.text.splitlines()) - 1
    return stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--senders", type=int, default=200)
    parser.add_argument("--records", type=int, default=16, help="records per batch")
    parser.add_argument("--period", type=float, default=0.5, help="seconds between a sender's batches")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--database", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--workers", type=int, default=None, help="server workers (default: packscope serve's)")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        pg_name = None
        if args.database == "sqlite":
            database_url = f"sqlite:///{tmp}/bench.db"
        else:
            pg_name = f"packscope_bench_{uuid.uuid4().hex[:8]}"
            with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
                admin.execute(f'CREATE DATABASE "{pg_name}"')
            database_url = f"postgresql+psycopg://postgres@127.0.0.1:5432/{pg_name}"
        port = free_port()
        command = [
            sys.executable,
            "-m",
            "packscope",
            "serve",
            "--port",
            str(port),
            "--database-url",
            database_url,
            "--no-access-log",
        ]
        if args.workers:
            command += ["--workers", str(args.workers)]
        env = {**os.environ, "PACKSCOPE_INGEST_TOKEN": "", "PACKSCOPE_READ_TOKEN": ""}
        server = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            url = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                try:
                    httpx.get(url + "/api/v1/catalogue", timeout=1)
                    break
                except httpx.HTTPError:
                    assert time.monotonic() < deadline and server.poll() is None, "the server did not start"
                    time.sleep(0.3)
            stats = asyncio.run(drive(url, args))
        finally:
            server.terminate()
            server.wait(15)
            if pg_name:
                with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
                    admin.execute(f'DROP DATABASE IF EXISTS "{pg_name}" WITH (FORCE)')

    latencies = stats.pop("latencies")
    errors = stats.pop("errors")
    print(
        json.dumps(
            {
                "database": args.database,
                "senders": args.senders,
                "records_per_batch": args.records,
                "period_s": args.period,
                "seconds": args.seconds,
                "workers": args.workers or "default",
                "requests": len(latencies),
                "errors": len(errors),
                "error_kinds": sorted(set(map(str, errors))),
                "shed_503_429": stats["shed"],
                "latency_s": {q: percentile(latencies, p) for q, p in (("p50", 0.5), ("p95", 0.95), ("p99", 0.99))},
                "records_offered": stats["offered"],
                "records_acknowledged": stats["acknowledged"],
                "rows_stored": stats["stored"],
                "stored_equals_acknowledged": stats["stored"] == stats["acknowledged"],
                "elapsed_s": round(stats["elapsed_s"], 2),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
