"""The 16,384-rank ingest shape (issue 39): every rank has its own sender, so a job of 16,384 ranks
logging every 10 s is about 1,640 requests/s of one record each, from thousands of connections.

Against `packscope serve --workers 2` on a fresh PostgreSQL database (created and dropped here),
`--processes` generator processes (fanin_generator.py) hold `--connections` keep-alive connections
between them and send OPEN LOOP at `--rate` requests/s in all, one record a request, each
connection its ranks in turn. A closed loop (send, wait, send) cannot show this shape: with no
think time its senders wait on the server and offer only what it serves (Little's law). Latency is
from each request's scheduled send time, so queueing is never hidden (coordinated omission).

Per rate: the answers by status, latency p50/p95/p99/max, the offered and achieved rates, the CPU
seconds of the server's processes, of PostgreSQL's backends for this database and of the
generators (from /proc/<pid>/stat), the server's CPU per request and requests/s per server core,
the whole machine's busy CPU and load average; then stored = acknowledged: the run's (rank,
interval) keys in the database against those answered 200 with `accepted: 1`, each stored once
(the table's unique key), and the run's totals row counting each once. Prints one JSON object.

    python bench/ingest_fanin.py                            # 2,000 connections, 4 processes, 1,640 req/s, 30 s
    python bench/ingest_fanin.py --rates 800,1640,2400      # a sweep, one run per rate
    python bench/ingest_fanin.py --smoke                    # 8 connections for a second (the test's)
    python bench/ingest_fanin.py --py-spy DIR               # the server workers' stacks (py-spy raw), first rate

The generators run raw asyncio streams on uvloop (an agent's sender holds one connection and
writes a few hundred bytes; burst.py found httpx's pool at a few ms of client CPU a request with
200 connections open, these cost 87-141 µs: docs/benchmarks/2026-12-06-2core-ranks.md#dev-2026-12-06-fanin);
their CPU is reported beside the server's, since all share the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
from bench_data import run_body, scratch_database
from burst import cpu_seconds, machine_busy_s, percentile, server_pids

from packscope.core.ports import free_port

GENERATOR = Path(__file__).resolve().parent / "fanin_generator.py"
# Two workers each migrating a fresh database, on a machine other sessions load: more than the
# minute backend_scale.wait_until_serving gives.
START_WITHIN_S = 240.0


def answers(url: str) -> bool:
    try:
        return httpx.get(f"{url}/api/v1/catalogue", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def serve(database_url: str, workers: int, log: Path, prelude: str | None) -> tuple[subprocess.Popen[bytes], str]:
    """`packscope serve` as deployed: its worker processes, no access log, no tokens; its log to
    `log` (uvicorn's supervisor says there when it replaced a worker that missed its health check).
    `prelude`: Python every server process runs first (a sitecustomize.py: the workers are spawned
    afresh, so only the interpreter's start reaches them), for a side-by-side variant."""
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PACKSCOPE_")}
    if prelude:
        (log.parent / "sitecustomize.py").write_text(prelude + "\n")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(log.parent), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", "packscope", "serve", "--port", str(port), "--workers", str(workers)]
    command += ["--database-url", database_url, "--no-access-log"]
    # Not from the checkout, whose alembic/ would shadow the library.
    with log.open("wb") as sink:
        server = subprocess.Popen(command, env=env, cwd=tempfile.gettempdir(), stderr=sink)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_WITHIN_S
        while not answers(url):
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit(f"the server did not start within {START_WITHIN_S:g} s")
            time.sleep(0.5)
    except BaseException:  # not started in time: not left running either
        server.terminate()
        server.wait(20)
        raise
    return server, url


def backend_pids(dbname: str) -> list[int]:
    """PostgreSQL's backend processes connected to this benchmark's database (not others')."""
    with psycopg.connect(f"host=127.0.0.1 port=5432 user=postgres dbname={dbname}", autocommit=True) as pg:
        rows = pg.execute(
            "SELECT pid FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()", (dbname,)
        ).fetchall()
    return [pid for (pid,) in rows]


def commits(dbname: str) -> int:
    """Transactions committed in this database so far (ingest's, and the alert worker's reads)."""
    with psycopg.connect(f"host=127.0.0.1 port=5432 user=postgres dbname={dbname}", autocommit=True) as pg:
        row = pg.execute("SELECT xact_commit FROM pg_stat_database WHERE datname = %s", (dbname,)).fetchone()
    return int(row[0]) if row else 0


def restarts(log: Path) -> int:
    """Workers uvicorn's supervisor replaced so far (a worker that missed its health check is killed)."""
    return log.read_text(errors="replace").count("died")


def per_pid_cpu(pids: list[int]) -> dict[int, float]:
    return {pid: cpu_seconds([pid]) for pid in pids}


def stored_keys(dbname: str, run_id: str) -> tuple[list[tuple[int, int]], int]:
    """The run's stored (rank, interval) keys, and the rows its totals row counts."""
    with psycopg.connect(f"host=127.0.0.1 port=5432 user=postgres dbname={dbname}") as pg:
        keys = pg.execute(
            "SELECT i.rank, i.interval FROM intervals i JOIN runs r ON r.id = i.run_pk WHERE r.run_id = %s",
            (run_id,),
        ).fetchall()
        totals = pg.execute(
            "SELECT t.rows FROM run_totals t JOIN runs r ON r.id = t.run_pk WHERE r.run_id = %s", (run_id,)
        ).fetchone()
    return [(rank, interval) for rank, interval in keys], (totals[0] if totals else 0)


def generators(
    url: str, run_id: str, rate: float, args: argparse.Namespace, results: Path
) -> list[tuple[subprocess.Popen[str], Path]]:
    """The generator processes, each with its share of the connections, started and connected;
    each with the file its result will be written to."""
    started = []
    share, extra = divmod(args.connections, args.processes)
    first = 0
    for p in range(args.processes):
        count = share + (p < extra)
        command = [sys.executable, str(GENERATOR), "--url", url, "--run-id", run_id, "--first", str(first)]
        command += ["--count", str(count), "--connections", str(args.connections), "--ranks", str(args.ranks)]
        command += ["--rate", str(rate), "--seconds", str(args.seconds), "--loop", args.loop]
        out = results / f"generator-{p}.json"
        command += ["--out", str(out)]
        started.append((subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True), out))
        first += count
    for generator, _ in started:
        assert generator.stdout is not None
        line = generator.stdout.readline()
        if line.strip() != "ready":
            raise SystemExit(f"a generator did not start: {line!r}")
    return started


def one_rate(
    url: str, dbname: str, server: subprocess.Popen[bytes], log: Path, rate: float, args: argparse.Namespace
) -> Any:
    run_id = f"fanin-{int(rate)}"
    answer = httpx.post(f"{url}/api/v1/runs", json=run_body(run_id), timeout=30)
    assert answer.status_code == 201, answer.text
    results = Path(tempfile.mkdtemp(prefix="fanin-"))
    started = generators(url, run_id, rate, args, results)
    serving = server_pids(server.pid)
    workers = [pid for pid in serving if pid != server.pid]
    spies = []
    if args.py_spy and not args.py_spy_taken:
        args.py_spy_taken = True
        Path(args.py_spy).mkdir(parents=True, exist_ok=True)
        for pid in workers:
            out = Path(args.py_spy) / f"worker-{pid}.txt"
            record = [args.py_spy_bin, "record", "--format", "raw", "--nonblocking", "--rate", "50", "-p", str(pid)]
            record += ["-d", str(int(args.seconds) + 2), "-o", str(out)]
            spies.append(subprocess.Popen(record, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    backends0 = per_pid_cpu(backend_pids(dbname))
    commits0, restarts0 = commits(dbname), restarts(log)
    load0 = os.getloadavg()
    server0, busy0, own0 = cpu_seconds(serving), machine_busy_s(), time.process_time()
    t0 = time.monotonic() + 0.5
    for generator, _ in started:
        assert generator.stdin is not None
        generator.stdin.write(f"{t0}\n")
        generator.stdin.flush()
    for generator, _ in started:
        generator.communicate()
        assert generator.returncode == 0, f"a generator failed ({generator.returncode})"
    outs = [json.loads(path.read_text()) for _, path in started]
    shutil.rmtree(results)
    end = time.monotonic()
    server_s = cpu_seconds(serving) - server0
    busy_s = machine_busy_s() - busy0
    backends1 = per_pid_cpu(backend_pids(dbname))
    postgres_s = sum(cpu - backends0.get(pid, 0.0) for pid, cpu in backends1.items())
    load1 = os.getloadavg()
    # The stats collector reports a backend's commits within a second or so.
    time.sleep(1.5)
    committed = commits(dbname) - commits0
    for spy in spies:
        spy.wait(30)

    statuses: dict[str, int] = {}
    for out in outs:
        for status, n in out["statuses"].items():
            statuses[status] = statuses.get(status, 0) + n
    latencies = [x for out in outs for x in out["latencies"]]
    lags = [x for out in outs for x in out["start_lag"]]
    acknowledged = [tuple(k) for out in outs for k in out["acknowledged"]]
    unanswered = {tuple(k) for out in outs for k in out["unanswered"]}
    keys, totals_rows = stored_keys(dbname, run_id)
    stored, acked = set(keys), set(acknowledged)
    answered = len(latencies)
    ok = statuses.get("200", 0)
    elapsed = max(out["finished"] for out in outs) - t0
    generator_s = sum(out["cpu_s"] for out in outs)
    return {
        "rate_target": rate,
        "requests_offered": answered + len(unanswered),
        "answered_by_status": dict(sorted(statuses.items())),
        "acknowledged": len(acknowledged),
        "errors": answered + len(unanswered) - ok,
        "answered_200_not_accepted": sum(out["not_accepted"] for out in outs),
        "latency_from_schedule_s": {
            "p50": percentile(latencies, 0.50),
            "p95": percentile(latencies, 0.95),
            "p99": percentile(latencies, 0.99),
            "max": max(latencies, default=None),
        },
        "send_lag_s": {"p50": percentile(lags, 0.50), "p99": percentile(lags, 0.99), "max": max(lags, default=None)},
        "offered_rate": round((answered + len(unanswered)) / args.seconds, 1),
        "achieved_rate_200": round(ok / elapsed, 1),
        "elapsed_s": round(elapsed, 2),
        "cpu_s": {
            "server": round(server_s, 2),
            "postgres_backends": round(postgres_s, 2),
            "generators": round(generator_s, 2),
            "bench_parent": round(time.process_time() - own0, 2),
            "whole_machine_busy": round(busy_s, 2),  # everything on the machine, other sessions' too
        },
        "server_cpu_us_per_request": round(server_s / max(answered, 1) * 1e6, 1),
        "server_plus_postgres_cpu_us_per_request": round((server_s + postgres_s) / max(answered, 1) * 1e6, 1),
        "requests_per_s_per_server_core": round(answered / server_s, 1) if server_s else None,
        "generator_cpu_us_per_request": round(generator_s / max(answered + len(unanswered), 1) * 1e6, 1),
        "machine_busy_fraction": round(busy_s / ((end - t0 + 0.5) * (os.cpu_count() or 1)), 3),
        "load_avg_before": load0,
        "load_avg_after": load1,
        "reopened_connections": sum(out["reopened"] for out in outs),
        "server_workers_replaced": restarts(log) - restarts0,
        "transactions_committed": committed,
        "acknowledged_per_transaction": round(len(acknowledged) / committed, 2) if committed else None,
        "stored_rows": len(keys),
        "stored_once": len(keys) == len(stored),
        "acknowledged_not_stored": len(acked - stored),
        "stored_not_acknowledged": len(stored - acked),
        "stored_not_acknowledged_unanswered": len((stored - acked) & unanswered),
        "run_totals_rows": totals_rows,
        # Nothing lost: every key acknowledged is stored, once; a key stored but not acknowledged
        # must be one whose answer never came (the agent would replay it: a duplicate, not a row).
        "nothing_lost": not (acked - stored) and (stored - acked) <= unanswered and len(keys) == totals_rows,
        "stored_equals_acknowledged": stored == acked and len(keys) == len(acknowledged) == totals_rows,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rates", default="1640", help="requests/s in all, comma-separated for a sweep")
    parser.add_argument("--connections", type=int, default=2000)
    parser.add_argument("--processes", type=int, default=4, help="generator processes")
    parser.add_argument("--seconds", type=float, default=30.0, help="sending time per rate")
    parser.add_argument("--ranks", type=int, default=16384)
    parser.add_argument("--workers", type=int, default=2, help="server processes")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop", help="the generators' loop")
    parser.add_argument("--py-spy", metavar="DIR", help="py-spy record each server worker during the first rate")
    parser.add_argument("--py-spy-bin", default="py-spy", help="the py-spy executable")
    parser.add_argument("--server-prelude", metavar="CODE", help="Python each server process runs first (A/B)")
    parser.add_argument("--smoke", action="store_true", help="8 connections of 64 ranks, 40 req/s for 1 s")
    args = parser.parse_args()
    if args.smoke:
        args.rates, args.connections, args.processes, args.seconds, args.ranks = "40", 8, 2, 1.0, 64
    args.py_spy_taken = False
    rates = [float(r) for r in args.rates.split(",")]
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the finally clauses stop the server, drop the database

    out: dict[str, Any] = {
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
        "cpus": os.cpu_count(),
        "connections": args.connections,
        "generator_processes": args.processes,
        "generator_loop": args.loop,
        "server_workers": args.workers,
        "server_prelude": args.server_prelude,
        "ranks": args.ranks,
        "seconds_per_rate": args.seconds,
        "load_avg_at_start": os.getloadavg(),
    }
    with scratch_database("postgresql") as database_url:
        dbname = database_url.rsplit("/", 1)[1]
        log = Path(tempfile.mkdtemp(prefix="fanin-server-")) / "server.log"
        server, url = serve(database_url, args.workers, log, args.server_prelude)
        try:
            out["rates"] = [one_rate(url, dbname, server, log, rate, args) for rate in rates]
        finally:
            server.terminate()
            server.wait(20)
            shutil.rmtree(log.parent)
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
