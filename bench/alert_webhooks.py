"""Ingest with alert webhooks whose receiver is absent, dead or slow (docs/alerts.md), side by side.

Each case is a fresh `packscope serve` (one worker, SQLite) holding `--alerting` runs marked
failed, so that as many crashed alerts have their webhook messages to send while a sender stores
interval records into another run as fast as the server answers:

* none: no webhook configured (the outbox stays empty);
* dead: the webhook's port refuses connections; every message is retried with backoff
  (PACKSCOPE_ALERT_RETRY_BASE_S=0.5, at most 4 s: shorter than the defaults, so the retries go on
  all along and the messages arrive soon after the receiver is back);
* slow: the receiver answers each message after --slow-s seconds.

Per case: ingest rows/s over --seconds of batches of 64 records (8 ranks, 8 intervals each) and the
server process's CPU per row (µs, from /proc) over the same time, the medians of --rounds rounds
(cases rotated each round), their ratios to `none`, and each round's ratio to that round's `none`.
The window spans several periods of the server's background work (the alert sweep every 5 s, which
judges every alerting run; a slow receiver's rounds of sends, one per --slow-s): a window shorter
than a period (12,800 rows took about 1 s) measured mostly whether a sweep fell in it. The noise is
`none`'s own spread over the rounds. Then, for `dead`, the receiver is brought up on that port and
the messages counted as they arrive (every one once), and for `slow` the messages it got. Prints
one JSON object.

    python bench/alert_webhooks.py [--seconds 20] [--rounds 3] [--alerting 100] [--slow-s 5]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
from bench_data import record, run_body

from packscope.core.ports import free_port

RANKS, INTERVALS_PER_BATCH = 8, 8


class Receiver:
    """Counts the messages it answers 2xx, by X-Packscope-Event-Id; waits `delay_s` before each answer."""

    def __init__(self, port: int, delay_s: float = 0.0) -> None:
        self.ids: list[str] = []
        lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the standard library's name
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                time.sleep(delay_s)
                with lock:
                    receiver.ids.append(self.headers.get("X-Packscope-Event-Id", ""))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            # The default backlog of 5 dropped some of a round's 20 connections, which the sender's
            # kernel retried a second later: the slow receiver answered after 6 s, not --slow-s.
            request_queue_size = 128

        self.server = Server(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def serve(database_url: str, hook: str | None) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PACKSCOPE_")}
    env.update(PACKSCOPE_ALERT_RETRY_BASE_S="0.5", PACKSCOPE_ALERT_RETRY_MAX_S="4")
    if hook:
        env["PACKSCOPE_ALERT_WEBHOOK_URL"] = hook
    command = [sys.executable, "-m", "packscope", "serve", "--port", str(port), "--workers", "1"]
    command += ["--database-url", database_url, "--no-access-log"]
    # Not from the checkout, whose alembic/ would shadow the library.
    server = subprocess.Popen(command, env=env, cwd=tempfile.gettempdir(), stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/api/v1/alerts", timeout=1).status_code == 200:
                return server, url
        except httpx.HTTPError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError("the server did not start")
        time.sleep(0.1)


_SLOT = re.compile(r'"\\u0000(\w+)"')  # where a template record's per-interval numbers go


class Bodies:
    """Batches of distinct intervals, made by a join of templates' JSON (record() costs about 50 ms
    a batch on the loaded machine; the window's batches are made as they are sent)."""

    def __init__(self, rng: random.Random, templates: int = 16) -> None:
        self.templates: list[list[tuple[int, float, list[str], list[str]]]] = []
        for _ in range(templates):
            records = []
            for k in range(INTERVALS_PER_BATCH):
                for rank in range(RANKS):
                    rec = record(0, rank, rng)
                    gpu_s = rec["wall_end"] - rec["wall_start"]
                    for slot in ("interval", "first_step", "last_step", "wall_start", "wall_end"):
                        rec[slot] = f"\0{slot}"
                    pieces = _SLOT.split(json.dumps(rec))
                    records.append((k, gpu_s, pieces[0::2], pieces[1::2]))
            self.templates.append(records)

    def body(self, b: int) -> str:
        out = []
        for k, gpu_s, texts, slots in self.templates[b % len(self.templates)]:
            i = b * INTERVALS_PER_BATCH + k
            value = {"interval": str(i), "first_step": str(i * 10 + 1), "last_step": str((i + 1) * 10),
                     "wall_start": repr(1.7e9 + i), "wall_end": repr(1.7e9 + i + gpu_s)}  # fmt: skip
            parts = [texts[0]]
            for slot, text in zip(slots, texts[1:], strict=True):
                parts += (value[slot], text)
            out.append("".join(parts))
        return '{"intervals": [' + ", ".join(out) + "]}"


def cpu_s(pid: int) -> float:
    """utime + stime of process `pid` and its children that were waited for, in seconds."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def ingest(client: httpx.Client, run_id: str, seconds: float, bodies: Bodies, pid: int) -> tuple[float, float]:
    """(rows/s, server CPU µs per row) over batches sent for `seconds`"""
    headers = {"Content-Type": "application/json"}
    sent = 0
    cpu, start = cpu_s(pid), time.perf_counter()
    while time.perf_counter() - start < seconds:
        client.post(f"/api/v1/runs/{run_id}/intervals", content=bodies.body(sent), headers=headers).raise_for_status()
        sent += 1
    wall, used = time.perf_counter() - start, cpu_s(pid) - cpu
    rows = sent * INTERVALS_PER_BATCH * RANKS
    return rows / wall, 1e6 * used / rows


def case(name: str, args: argparse.Namespace, bodies: Bodies) -> dict[str, Any]:
    hook_port = free_port()
    receiver = Receiver(hook_port, args.slow_s) if name == "slow" else None
    hook = None if name == "none" else f"http://127.0.0.1:{hook_port}/hook"
    with tempfile.TemporaryDirectory() as tmp:
        server, url = serve(f"sqlite:///{tmp}/bench.db", hook)
        try:
            with httpx.Client(base_url=url, timeout=60) as client:
                for i in range(args.alerting):
                    client.post("/api/v1/runs", json=run_body(f"failing-{i}")).raise_for_status()
                    client.patch(f"/api/v1/runs/failing-{i}", json={"status": "failed"}).raise_for_status()
                deadline = time.monotonic() + 30
                while len(client.get("/api/v1/alerts?limit=5000").json()) < args.alerting:
                    if time.monotonic() > deadline:
                        raise RuntimeError("the crashed alerts did not open")
                    time.sleep(0.1)
                client.post("/api/v1/runs", json=run_body("ingested")).raise_for_status()
                time.sleep(1.0)  # the first round of sends is out (and, dead, refused)
                rate, cpu = ingest(client, "ingested", args.seconds, bodies, server.pid)
                out: dict[str, Any] = {"rows_per_s": rate, "cpu_us_per_row": cpu}
                if name == "dead":  # the receiver comes back: every message arrives, once
                    back = time.monotonic()
                    receiver = Receiver(hook_port)
                    while len(set(receiver.ids)) < args.alerting and time.monotonic() - back < 60:
                        time.sleep(0.05)
                    out["after_back_s"] = time.monotonic() - back
                    time.sleep(1.0)
                if receiver is not None:
                    out["messages"], out["distinct"] = len(receiver.ids), len(set(receiver.ids))
        finally:
            stopping = time.monotonic()
            server.terminate()
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
            if receiver is not None:
                receiver.close()
        out["shutdown_s"] = time.monotonic() - stopping  # SIGTERM to exit (30: killed)
        return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seconds", type=float, default=20.0, help="each case's ingest window (default 20)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--alerting", type=int, default=100, help="runs with an open alert to send (default 100)")
    parser.add_argument("--slow-s", type=float, default=5.0, help="the slow receiver's delay per message")
    args = parser.parse_args()
    names = ["none", "dead", "slow"]
    bodies = Bodies(random.Random(0))  # the same batches in every case
    results: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for r in range(args.rounds):
        for name in names[r % 3 :] + names[: r % 3]:  # rotated, so drift spreads over the cases
            results[name].append(case(name, args, bodies))
    base_rates = [x["rows_per_s"] for x in results["none"]]
    base, base_cpu = statistics.median(base_rates), statistics.median(x["cpu_us_per_row"] for x in results["none"])
    summary: dict[str, Any] = {
        "args": vars(args),
        # none against itself: its rounds' slowest and fastest over their median
        "noise_none_min_max_over_median": [min(base_rates) / base, max(base_rates) / base],
        "cases": {},
    }
    for name, rounds in results.items():
        rates, cpus = [x["rows_per_s"] for x in rounds], [x["cpu_us_per_row"] for x in rounds]
        kept = ("messages", "distinct", "after_back_s", "shutdown_s")
        lists: dict[str, list[Any]] = {k: [x[k] for x in rounds] for k in kept if k in rounds[0]}
        summary["cases"][name] = {
            "rows_per_s_median": statistics.median(rates),
            "rows_per_s": [round(x) for x in rates],
            "ratio_to_none": statistics.median(rates) / base,
            "ratio_to_none_per_round": [round(x / b, 3) for x, b in zip(rates, base_rates, strict=True)],
            "cpu_us_per_row_median": statistics.median(cpus),
            "cpu_us_per_row": [round(x, 1) for x in cpus],
            "cpu_ratio_to_none": statistics.median(cpus) / base_cpu,
            **lists,
        }
    print(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
