"""Burst benchmark: N senders (a job's ranks) each post a batch of records every period, all at
the same instant, against a real `packscope serve` in a subprocess. Prints JSON.

A 503/429 answer is retried after its Retry-After (plus jitter) and counted, not an error; its
latency counts like any other answer's. Goal: no errors, p99 latency under 1 s, rows stored ==
records acknowledged. Each sender has one keep-alive connection of its own (a minimal HTTP/1.1
client, as light as an agent's) and serialises its records once; the CPU seconds of the client,
the server (all workers) and PostgreSQL during the burst are reported, since all share the cores.

    python bench/burst.py --seconds 20                    # PostgreSQL on 127.0.0.1:5432
    python bench/burst.py --database sqlite --seconds 20
"""

import argparse
import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psycopg

from packscope.core.ports import free_port

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "backend"))
from conftest import make_record, run_body  # type: ignore[import-not-found]  # the tests' record builder

PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
ANSWER_WITHIN_S = 30.0  # an answer later than this is an error (the server stalled), not a wait


def percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


# Placeholders for the numbers a batch changes: each sender serialises its records once and only
# swaps these in per batch (making JSON costs more client CPU than the server spends storing it).
_HOLES = {"interval": -777000001, "first_step": -777000002, "last_step": -777000003}


def template_of(record: dict[str, Any]) -> str:
    return json.dumps({**record, **_HOLES})


def renumbered(template: str, steps: int, interval: int) -> str:
    numbers = {"interval": interval, "first_step": interval * steps + 1, "last_step": (interval + 1) * steps}
    for key, hole in _HOLES.items():
        template = template.replace(str(hole), str(numbers[key]), 1)
    return template


class Connection:
    """One keep-alive HTTP/1.1 connection on asyncio streams: a sender's own, as an agent has.
    httpx's pool costs a few milliseconds of client CPU per request with 200 connections open, on
    the same two cores as the server; this costs a few tens of microseconds."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.streams: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None

    def close(self) -> None:
        if self.streams is not None:
            self.streams[1].close()
            self.streams = None

    async def post(self, path: str, body: bytes) -> tuple[int, dict[str, str], bytes]:
        if self.streams is None:
            self.streams = await asyncio.open_connection(self.host, self.port)
        reader, writer = self.streams
        head = (
            f"POST {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        )
        try:
            writer.write(head.encode() + body)
            status_line = await reader.readline()
            if not status_line:
                raise ConnectionError("the server closed the connection")
            headers = {}
            while (line := await reader.readline()) not in (b"\r\n", b""):
                name, _, value = line.decode().partition(":")
                headers[name.strip().lower()] = value.strip()
            answer = await reader.readexactly(int(headers.get("content-length", "0")))
        except (OSError, asyncio.IncompleteReadError):
            writer.close()
            self.streams = None
            raise
        return int(status_line.split()[1]), headers, answer


async def sender(rank: int, url: str, args: argparse.Namespace, t0: float, stats: dict[str, Any]) -> None:
    rng = random.Random(rank)
    records = [make_record(i, rng, rank=rank) for i in range(args.records)]
    templates = [template_of(r) for r in records]
    host, port = url.removeprefix("http://").split(":")
    connection = Connection(host, int(port))
    for tick in range(int(args.seconds / args.period)):
        await asyncio.sleep(max(0.0, t0 + tick * args.period - time.monotonic()))  # the shared boundary
        parts = [
            renumbered(t, r["steps"], tick * args.records + i)
            for i, (t, r) in enumerate(zip(templates, records, strict=True))
        ]
        body = ('{"intervals": [' + ", ".join(parts) + "]}").encode()
        stats["offered"] += args.records
        while True:
            started = time.monotonic()
            try:
                status, headers, answer = await asyncio.wait_for(
                    connection.post("/api/v1/runs/bench/intervals", body), ANSWER_WITHIN_S
                )
            except (OSError, asyncio.IncompleteReadError, TimeoutError) as exc:
                stats["errors"].append(type(exc).__name__)
                connection.close()  # a late answer must not be read as the next request's
                break
            stats["latencies"].append(time.monotonic() - started)
            if status in (429, 503):
                stats["shed"] += 1
                await asyncio.sleep(int(headers.get("retry-after", "1")) + rng.uniform(0, 0.5))
                continue
            if status != 200:
                stats["errors"].append(status)
            else:
                stats["acknowledged"] += json.loads(answer)["accepted"]
            break


def cpu_seconds(pids: list[int]) -> float:
    """User + system CPU seconds of these processes (from /proc; gone ones count 0)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / os.sysconf("SC_CLK_TCK")


def server_pids(root: int) -> list[int]:
    """The server and its worker processes."""
    pids, seen = [root], 0
    while seen < len(pids):
        pid = pids[seen]
        seen += 1
        for task in Path(f"/proc/{pid}/task").glob("*/children"):
            pids += [int(child) for child in task.read_text().split()]
    return pids


def postgres_pids() -> list[int]:
    pids = []
    for comm in Path("/proc").glob("[0-9]*/comm"):
        try:
            if comm.read_text().startswith("postgres"):
                pids.append(int(comm.parent.name))
        except OSError:
            continue
    return pids


def machine_busy_s() -> float:
    """CPU seconds the whole machine spent busy (user, nice, system, irq, softirq), all cores."""
    with open("/proc/stat") as stat:
        fields = [int(x) for x in stat.readline().split()[1:8]]
    user, nice, system, _idle, _iowait, irq, softirq = fields
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


async def drive(url: str, args: argparse.Namespace, server: int) -> dict[str, Any]:
    stats: dict[str, Any] = {"offered": 0, "acknowledged": 0, "shed": 0, "errors": [], "latencies": []}
    async with httpx.AsyncClient(base_url=url, timeout=30) as http:
        assert (await http.post("/api/v1/runs", json=run_body("bench"))).status_code in (200, 201)
        serving, databases = server_pids(server), postgres_pids()
        cpu0 = time.process_time(), cpu_seconds(serving), cpu_seconds(databases), machine_busy_s()
        t0 = time.monotonic() + 0.5
        await asyncio.gather(*(sender(rank, url, args, t0, stats) for rank in range(args.senders)))
        stats["elapsed_s"] = time.monotonic() - t0
        stats["cpu_s"] = {
            "client": round(time.process_time() - cpu0[0], 2),
            "server": round(cpu_seconds(serving) - cpu0[1], 2),
            "postgres": round(cpu_seconds(postgres_pids()) - cpu0[2], 2) if args.database == "postgres" else None,
            "whole_machine": round(machine_busy_s() - cpu0[3], 2),  # everything on the box, others' work too
        }
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
    # A `timeout` or Ctrl-C still stops the server and drops the scratch database (finally clauses).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

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
            stats = asyncio.run(drive(url, args, server.pid))
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
                "cpu_s": stats["cpu_s"],
                "server_cpu_us_per_row": round(stats["cpu_s"]["server"] / max(stats["acknowledged"], 1) * 1e6, 1),
                "load_avg_end": os.getloadavg(),
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
