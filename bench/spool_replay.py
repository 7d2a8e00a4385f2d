"""The sender's spool at scale: fill, append, evict and replay, for spools of several sizes.

For each size (MiB of record JSON) it fills a spool with realistic interval records (the shape of
agent.py's _record: ~1.5 KB with four 24-bucket histograms, sync sites and GPU telemetry) and
measures, on the machine's disk:

  append        encode + append in batches of 64 into the full spool (the sender thread with a
                backlog): records and MiB per second; each commit is synced to the disk
  append_one    one record per commit (the steady state: one interval at a time), p50 and p99
  evict         a 64-record append that evicts as many old ones, vs the same append without eviction
  replay_null   head(64) + join the bodies as the wire batch + ack, until empty: the spool's own cost
  replay_http   the real Sender replaying the spool to a local HTTP server (another process) that
                gunzips each batch and answers {"accepted": n, "duplicates": 0}; by default only
                for spools up to 64 MiB (--http-max-mib), to keep the run near two minutes

and reports seconds per MiB for each, so replay time can be checked to be linear in the size.

    .venv/bin/python bench/spool_replay.py [--sizes 16,64,256] [--dir /path/on/the/disk]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from packscope.agent.config import AgentConfig
from packscope.agent.sender import Sender, spool_path
from packscope.agent.spool import Spool, encode

MIB = 1024 * 1024
BATCH = 64

# A stand-in for the backend that does no more than the sender needs: runs are accepted, and each
# intervals batch is gunzipped and counted (one "interval" key per record).
SERVER = r"""
import gzip, json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *args):
        pass
    def do_POST(self):
        body = gzip.decompress(self.rfile.read(int(self.headers["Content-Length"])))
        n = body.count(b'"interval":')
        answer = json.dumps({"accepted": n, "duplicates": 0} if self.path.endswith("/intervals") else {}).encode()
        self.send_response(200 if self.path.endswith("/intervals") else 201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(answer)))
        self.end_headers()
        self.wfile.write(answer)

server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever()
"""


def make_record(i: int, rng: random.Random) -> dict:
    """An interval record as agent.py builds it, with plausible numbers for an 8-GPU SFT run."""

    def histogram(scale: int) -> list[int]:
        counts = [0] * 24
        for bucket in range(5, 15):
            counts[bucket] = rng.randint(0, scale)
        return counts

    steps, tokens = 10, 10 * 8 * 16384
    durations = sorted(rng.uniform(0.9, 1.4) for _ in range(steps))
    return {
        "interval": i, "rank": 0, "first_step": i * steps + 1, "last_step": (i + 1) * steps, "steps": steps, "gpus": 8,
        "wall_start": 1.79e9 + i * 12.5 + rng.random(), "wall_end": 1.79e9 + i * 12.5 + 12 + rng.random(),
        "gpu_time_s": sum(durations), "host_time_s": sum(durations) + rng.random(),
        "step_time_p50_s": durations[steps // 2], "step_time_p90_s": durations[-2], "step_time_max_s": durations[-1],
        "timing_lag_steps": rng.randint(0, steps), "tokens": tokens, "real_tokens": rng.randint(tokens // 2, tokens),
        "packs": 80, "documents": rng.randint(100, 900),
        "seqlen_sq_sum_bshd": 80 * 16384**2, "seqlen_sq_sum_thd": rng.randint(10**9, 10**12),
        "flops_bshd": rng.uniform(1e17, 1e18), "flops_thd": rng.uniform(1e17, 1e18),
        "flops_useful": rng.uniform(1e17, 1e18),
        "syncs": {"total": 20, "per_iteration": 2.0, "sites": [
            {"site": f"/workspace/train/loop.py:{rng.randint(1, 900)}", "count": rng.randint(1, 10)}
            for _ in range(4)]},
        "histograms": {"documents": {"count": histogram(200), "tokens": histogram(100_000)},
                       "packs": {"count": histogram(80), "tokens": histogram(1_300_000)}},
        "loss": rng.uniform(1, 3), "lr": 3e-4, "grad_norm": rng.uniform(0.1, 2),
        "gpu": {"util_pct": rng.uniform(90, 100), "power_w": rng.uniform(500, 700), "sm_clock_mhz": 1980.0,
                "mem_used_bytes": float(rng.randint(10**10, 10**11)), "energy_j": rng.uniform(5000, 9000)},
    }  # fmt: skip


def record_tails(rng: random.Random, n: int = 4096) -> list[str]:
    """n distinct encoded records, minus their leading '{"interval":N,' (interval is the first key)."""
    return [encode(make_record(i, rng)).split(",", 1)[1] for i in range(n)]


def fill(spool: Spool, size_bytes: int, tails: list[str]) -> dict:
    """Bulk-fill to size_bytes: realistic bodies from the pool, 1024 per commit (setup, not a figure
    of the sender's; `append` below measures that)."""
    n = len(spool)
    t0 = time.perf_counter()
    while spool.bytes < size_bytes:
        spool.append([f'{{"interval":{n + k},{tails[(n + k) % len(tails)]}' for k in range(1024)])
        n += 1024
    return {"records": n, "seconds": round(time.perf_counter() - t0, 2)}


def append(spool: Spool, rng: random.Random, first: int, mib: float = 2.0) -> dict:
    """encode + append in batches of 64 (the sender thread with a backlog) into a spool already
    at its size: records and MiB per second."""
    n, added, seconds = 0, 0, 0.0
    while added < mib * MIB:
        records = [make_record(first + n + k, rng) for k in range(BATCH)]  # not timed: the trainer's
        t0 = time.perf_counter()
        bodies = [encode(r) for r in records]
        spool.append(bodies)
        seconds += time.perf_counter() - t0
        n, added = n + BATCH, added + sum(map(len, bodies))
    return {"records_per_s": round(n / seconds), "mib_per_s": round(added / MIB / seconds, 2)}


def append_one(spool: Spool, rng: random.Random, first: int, n: int = 100) -> dict:
    bodies = [encode(make_record(first + k, rng)) for k in range(n)]
    times = []
    for body in bodies:
        t0 = time.perf_counter()
        spool.append([body])
        times.append(time.perf_counter() - t0)
    times.sort()
    return {"p50_ms": round(1e3 * times[n // 2], 3), "p99_ms": round(1e3 * times[int(n * 0.99)], 3)}


def evict(spool: Spool, rng: random.Random, first: int, rounds: int = 20) -> dict:
    """A full spool: each 64-record append evicts 64 old records. Same appends without the limit."""
    batches = [[encode(make_record(first + r * BATCH + k, rng)) for k in range(BATCH)] for r in range(2 * rounds)]

    def mean_ms(chunk: list[list[str]]) -> float:
        t0 = time.perf_counter()
        for batch in chunk:
            spool.append(batch)
        return round(1e3 * (time.perf_counter() - t0) / len(chunk), 3)

    limit = spool.max_bytes
    spool.max_bytes = 10**15
    without = mean_ms(batches[:rounds])
    spool.max_bytes = spool.bytes  # from now on, every append evicts about as much as it adds
    evicted_before = spool.evicted
    with_eviction = mean_ms(batches[rounds:])
    evicted = spool.evicted - evicted_before
    spool.max_bytes = limit
    return {"ms_per_append_of_64": without, "ms_per_append_of_64_evicting": with_eviction,
            "evicted_per_append": round(evicted / rounds, 1)}  # fmt: skip


def replay_null(path: Path) -> dict:
    spool = Spool(path, max_bytes=10**15)
    spool.open()
    mib, n = spool.bytes / MIB, len(spool)
    t0 = time.perf_counter()
    while entries := spool.head(BATCH):
        ('{"intervals":[' + ",".join(e.body for e in entries) + "]}").encode()  # what the sender POSTs
        spool.ack(entries)
    seconds = time.perf_counter() - t0
    spool.close()
    return _rate(seconds, mib, n)


def replay_http(spool_dir: Path, run_id: str, url: str, mib: float, n: int) -> dict:
    config = AgentConfig(server=url, spool_dir=str(spool_dir), batch_size=BATCH, request_timeout_s=30)
    t0 = time.perf_counter()
    sender = Sender(config, run_id, {"run_id": run_id})
    ok = sender.close(None, timeout_s=1800)
    seconds = time.perf_counter() - t0
    stats = sender.stats()
    assert ok and stats["sent"] == n and stats["spooled"] == 0, stats
    return _rate(seconds, mib, n)


def _rate(seconds: float, mib: float, n: int) -> dict:
    return {"seconds": round(seconds, 2), "s_per_mib": round(seconds / mib, 4), "records_per_s": round(n / seconds)}


def file_mib(path: Path) -> float:
    return round(sum(os.path.getsize(p) for p in path.parent.glob(path.name + "*")) / MIB, 1)


def one_size(size_mib: int, workdir: Path, url: str, rng: random.Random, tails: list[str], http_max_mib: int) -> dict:
    run_id = f"bench-{size_mib}mib"
    config = AgentConfig(server=url, spool_dir=str(workdir))
    path = spool_path(config, run_id)
    spool = Spool(path, max_bytes=10**15)
    filled = fill(spool, size_mib * MIB, tails)
    result: dict = {"size_mib": size_mib, "record_mean_bytes": round(spool.bytes / len(spool)), "fill": filled}
    result["append"] = append(spool, rng, first=10**7)
    result["append_one"] = append_one(spool, rng, first=2 * 10**7)
    result["evict"] = evict(spool, rng, first=3 * 10**7)
    result["records"], mib = len(spool), spool.bytes / MIB
    spool.close()
    result["file_mib"] = file_mib(path)

    copy = workdir / "null" / path.name  # replaying empties a spool: the null sink gets a copy
    copy.parent.mkdir(exist_ok=True)
    shutil.copyfile(path, copy)
    result["replay_null"] = replay_null(copy)
    shutil.rmtree(copy.parent)
    if size_mib <= http_max_mib:
        result["replay_http"] = replay_http(workdir, run_id, url, mib, result["records"])
    path.unlink(missing_ok=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="16,64,256", help="spool sizes in MiB of record JSON (default 16,64,256)")
    parser.add_argument("--dir", default=None, help="where the spools go (default: a temporary directory)")
    parser.add_argument(
        "--http-max-mib",
        type=int,
        default=64,
        help="replay through HTTP only the spools up to this size (default 64: 256 MiB takes minutes)",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    logging.getLogger("packscope.agent").setLevel(logging.ERROR)  # one eviction warning per append
    rng = random.Random(args.seed)

    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = f"http://127.0.0.1:{int(server.stdout.readline())}"
        with tempfile.TemporaryDirectory(dir=args.dir, prefix="spool-bench-") as tmp:
            tails = record_tails(rng)
            results = [one_size(size, Path(tmp), url, rng, tails, args.http_max_mib) for size in sizes]
    finally:
        server.terminate()
        server.wait()

    def per_mib(key: str) -> list[float]:
        return [r[key]["s_per_mib"] for r in results if key in r]

    def spread(key: str) -> float:  # max/min of seconds per MiB over the sizes: 1.0 is exactly linear
        return round(max(per_mib(key)) / min(per_mib(key)), 2)

    print(json.dumps({
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "sqlite": sqlite3.sqlite_version,
                    "platform": platform.platform()},
        "batch": BATCH,
        "sizes": results,
        "linearity": {
            "sizes_mib": sizes,
            "replay_null_s_per_mib": per_mib("replay_null"),
            "replay_http_s_per_mib": per_mib("replay_http"),
            "replay_null_max_over_min": spread("replay_null"),
            "replay_http_max_over_min": spread("replay_http"),
            "append_records_per_s": [r["append"]["records_per_s"] for r in results],
            "append_one_p50_ms": [r["append_one"]["p50_ms"] for r in results],
            "evict_ms_per_append_of_64": [r["evict"]["ms_per_append_of_64_evicting"] for r in results],
            "median_record_bytes": statistics.median(r["record_mean_bytes"] for r in results),
        },
    }, indent=2))  # fmt: skip


if __name__ == "__main__":
    main()
