"""Full garbage collections in a serving process, with and without the app's `gc.freeze()`.

The app freezes what exists once it is built (its lifespan, backend/server/app.py), so that the
collector's full (generation-2) collections skip those objects. This bench serves the same load
from two servers in turn (SQLite, uvicorn, started as backend_scale.py starts them): the app as it
is, and the app with `gc.freeze` made a no-op. A `gc.callbacks` hook in each server writes the
duration of every full collection to a file; the bench reports those that came after the load
began (the ones during imports and start-up are not the serving process's), with the server CPU
per row and the latency of series reads made during the ingest.

    python bench/gc_pause.py [--batches 1000] [--rounds 2]

Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import threading
import time
from typing import Any

import httpx
from backend_scale import BATCH, cpu_seconds, p, start_server, stop_server
from bench_data import record, run_body

from packscope.backend.store.db import make_engine, upgrade_schema

# Python run in the server before the app is built: log each full collection as "start end ms".
_HOOK = """
import gc, time
_log = open({log!r}, "a")
_began = [0.0]
def _full_collections(phase, info):
    if info["generation"] != 2:
        return
    if phase == "start":
        _began[0] = time.monotonic()
    else:
        _log.write(f"{{_began[0]}} {{(time.monotonic() - _began[0]) * 1000}}\\n")
        _log.flush()
gc.callbacks.append(_full_collections)
"""
_NO_FREEZE = "gc.freeze = lambda: None\n"


def serve_load(args: argparse.Namespace, freeze: bool, bodies: list[bytes]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as folder:
        database_url, log = f"sqlite:///{folder}/bench.db", f"{folder}/collections.txt"
        upgrade_schema(make_engine(database_url))
        hook = _HOOK.format(log=log) + ("" if freeze else _NO_FREEZE)
        server, url = start_server(database_url, prelude=f"exec({hook!r}); ")
        try:
            http = httpx.Client(base_url=url, timeout=60)
            assert http.post("/api/v1/runs", json=run_body("gc")).status_code == 201
            began, cpu0 = time.monotonic(), cpu_seconds(server.pid)
            senders = [bodies[i::4] for i in range(4)]
            reads: list[float] = []

            def send(part: list[bytes]) -> None:
                with httpx.Client(base_url=url, timeout=60) as client:
                    for body in part:
                        response = client.post("/api/v1/runs/gc/intervals", content=body)
                        assert response.status_code == 200, response.text[:200]

            threads = [threading.Thread(target=send, args=(part,)) for part in senders]
            for t in threads:
                t.start()
            while any(t.is_alive() for t in threads):  # a dashboard reading while the job writes
                t0 = time.perf_counter()
                assert http.get("/api/v1/runs/gc/series?max_points=1000").status_code == 200
                reads.append(time.perf_counter() - t0)
                time.sleep(0.05)
            for t in threads:
                t.join()
            cpu = cpu_seconds(server.pid) - cpu0
        finally:
            stop_server(server)
        with open(log) as lines:
            pauses = [float(ms) for start, ms in (line.split() for line in lines) if float(start) >= began]
    return {
        "gc_freeze": freeze,
        "rows": len(bodies) * BATCH,
        "server_cpu_us_per_row": round(cpu / (len(bodies) * BATCH) * 1e6, 1),
        "full_collections": len(pauses),
        "full_collection_ms": [round(ms, 1) for ms in pauses],
        "series_reads": len(reads),
        "series_ms_p50": p(reads, 0.5),
        "series_ms_p95": p(reads, 0.95),
        "series_ms_max": p(reads, 1.0),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=1000, help="batches of 64 records (4 senders) per server")
    ap.add_argument("--rounds", type=int, default=2, help="servers of each kind, alternated")
    args = ap.parse_args()
    rng = random.Random(1)
    bodies = [
        json.dumps({"intervals": [record(b * BATCH + i, b % 4, rng) for i in range(BATCH)]}).encode()
        for b in range(args.batches)
    ]
    out: dict[str, Any] = {"cpus": os.cpu_count(), "load_avg_start": os.getloadavg(), "runs": []}
    for round_ in range(args.rounds):
        for freeze in (True, False) if round_ % 2 == 0 else (False, True):  # neither always goes first
            out["runs"].append(serve_load(args, freeze, bodies))
    out["load_avg_end"] = os.getloadavg()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
