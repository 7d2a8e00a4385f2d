"""Where the series' time goes (issue 8: the series of a 1,000,000-interval run, max_points=1000,
within 150 ms at p95): every request of backend_scale's read sequence timed on its own, with the
server's own account of it.

    python bench/series_latency.py --database sqlite|postgresql [--intervals 1000000] [--repeat 60]
        [--keep NAME] [--server-pythonpath LABEL=DIR ...] [--rounds 2]

A run of --intervals intervals (1 rank) is filled in this process as bench/backend_scale.py fills
it (64 distinct records re-numbered, ingest_batch in batches of 1000); --keep NAME keeps that
database between invocations (a SQLite file /tmp/NAME.db, or the PostgreSQL database NAME) and
reuses it when it already holds the run. Then, for each server (this checkout's, "head", and each
--server-pythonpath LABEL=DIR: a directory holding another checkout laid out as the packscope
package, as backend_scale's option), --rounds times, servers taking turns: a fresh uvicorn server
is started and sent backend_scale's read sequence: --repeat whole-run series (max_points=1000),
--repeat run page loads (summary, series, sync sites), --repeat series of the last 50 intervals.

Each request's wall time is taken by the client; the server process (through a prelude run
before the app is built) records the wall time of each series() call and of its parts
(wall_origin, _interval_range, _read_tiles, _channel_series) and every garbage collection
(generation, duration, start), all on CLOCK_MONOTONIC, which this process shares, so each request
gets its series time, the collections that ran inside it, and the rest (HTTP, the response's
validation and JSON). Prints one JSON object: per server and request kind, p50 / p95 / max and
the first request apart, and the slowest requests' accounts.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
from backend_scale import start_server, stop_server, store_renumbered
from bench_data import PG_ADMIN, record, run_body

from packscope.backend.store.db import make_engine, make_sessionmaker, upgrade_schema

RUN_ID = "big"

# Run in the server before the app is built: records collections and series() calls, and writes
# them to $SERIES_LATENCY_OUT when the server exits.
PRELUDE = r"""
import atexit, gc, json, os, time  # noqa
_gc, _calls, _open = [], [], {}
def _collected(phase, info):
    if phase == "start":
        _open["gc"] = time.monotonic()
    else:
        _gc.append((_open.pop("gc"), time.monotonic(), info["generation"]))
gc.callbacks.append(_collected)
try:
    import packscope.backend.reads.series as _module
except ImportError:
    import packscope.backend.reads.queries as _module
def _timed(name):
    inner = getattr(_module, name, None)
    if inner is None:
        return
    def timed(*args, **kwargs):
        t0 = time.monotonic()
        try:
            return inner(*args, **kwargs)
        finally:
            _calls.append((name, t0, time.monotonic()))
    setattr(_module, name, timed)
for _name in ("series", "wall_origin", "_interval_range", "_read_tiles", "_channel_series", "_more_rows_than"):
    _timed(_name)
def _dump():
    with open(os.environ["SERIES_LATENCY_OUT"], "w") as f:
        json.dump({"module": _module.__file__, "gc": _gc, "calls": _calls, "gc_threshold": gc.get_threshold()}, f)
atexit.register(_dump)
import signal as _signal
_raise_signal = _signal.raise_signal
def _dump_then_raise(number):  # uvicorn re-raises the SIGTERM it caught once it has shut down
    _dump()
    _raise_signal(number)
_signal.raise_signal = _dump_then_raise
"""


def keep_url(database: str, name: str) -> str:
    if database == "sqlite":
        return f"sqlite:////tmp/{name}.db"
    import psycopg

    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        if admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is None:
            admin.execute(f'CREATE DATABASE "{name}"')
    return f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"


def ensure_run(url: str, intervals: int) -> float | None:
    """The run RUN_ID of `intervals` intervals in the database at `url`: filled unless already
    there; seconds the fill took (None if it was there)."""
    engine = make_engine(url)
    upgrade_schema(engine)
    make_session = make_sessionmaker(engine)
    from sqlalchemy import text

    with engine.connect() as c:
        found = c.execute(
            text("SELECT t.last_interval FROM runs r JOIN run_totals t ON t.run_pk = r.id WHERE r.run_id = :run_id"),
            {"run_id": RUN_ID},
        ).first()
    if found is not None and found[0] == intervals - 1:
        engine.dispose()
        return None
    if found is not None:
        raise SystemExit(f"{url} holds a run {RUN_ID!r} of another length; remove it or use another --keep")
    server, base = start_server(url)
    try:
        with httpx.Client(base_url=base, timeout=60) as http:
            assert http.post("/api/v1/runs", json=run_body(RUN_ID)).status_code == 201
    finally:
        stop_server(server)
    rng = random.Random(RUN_ID)
    template = [record(i, 0, rng) for i in range(64)]
    seconds = store_renumbered(make_session, RUN_ID, template, intervals)
    engine.dispose()
    return seconds


def quantile(values: list[float], q: float) -> float:
    """backend_scale's p(): the sorted value at int(q·n) (with 20 values, p95 is the maximum)."""
    return sorted(values)[min(len(values) - 1, int(q * len(values)))]


def summary(values: list[float]) -> dict[str, float]:
    ms = [v * 1000 for v in values]
    return {
        "n": len(ms),
        "p50": round(quantile(ms, 0.5), 1),
        "p95": round(quantile(ms, 0.95), 1),
        "max": round(max(ms), 1),
        "mean": round(sum(ms) / len(ms), 1),
    }


def one_server(
    url: str, label: str, pythonpath: str | None, intervals: int, repeat: int, freeze: bool
) -> dict[str, Any]:
    """A fresh server, backend_scale's read sequence, each request timed and accounted for."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        stats_path = f.name
    os.environ["SERIES_LATENCY_OUT"] = stats_path
    prelude = f"exec({PRELUDE!r}); "
    if freeze:  # what a gc.freeze() once the app is imported would do (not what the app does)
        prelude += "import packscope.backend.server.app; gc.collect(); gc.freeze(); "
    server, base = start_server(url, 1, pythonpath, prelude)
    base_path = f"/api/v1/runs/{RUN_ID}"
    whole = f"{base_path}/series?max_points=1000"
    sequence = [("series", [whole])] * repeat
    sequence += [("page", [base_path, whole, f"{base_path}/sync-sites"])] * repeat
    sequence += [("recent", [f"{base_path}/series?max_points=1000&step_min={intervals * 10 - 500}"])] * repeat
    requests: list[dict[str, Any]] = []
    load = os.getloadavg()
    try:
        with httpx.Client(base_url=base, timeout=300) as http:
            for ordinal, (kind, paths) in enumerate(sequence):
                for path in paths:
                    t0 = time.monotonic()
                    response = http.get(path)
                    t1 = time.monotonic()
                    assert response.status_code == 200, (path, response.text[:200])
                    requests.append({"ordinal": ordinal, "kind": kind, "path": path, "t0": t0, "t1": t1})
    finally:
        server.terminate()
        server.wait(30)
    stats = json.loads(Path(stats_path).read_text())
    os.unlink(stats_path)
    for r in requests:
        inside = [c for c in stats["calls"] if r["t0"] <= c[1] and c[2] <= r["t1"]]
        r["parts_ms"] = {}
        for name, a, b in inside:
            r["parts_ms"][name] = round(r["parts_ms"].get(name, 0) + (b - a) * 1000, 2)
        gcs = [g for g in stats["gc"] if r["t0"] <= g[0] <= r["t1"]]
        r["gc_ms"] = {str(gen): round(sum(b - a for a, b, g in gcs if g == gen) * 1000, 2) for gen in (0, 1, 2)}
        r["ms"] = round((r["t1"] - r["t0"]) * 1000, 2)
    out: dict[str, Any] = {"label": label, "module": stats["module"], "load_avg_start": load}
    series_requests = [r for r in requests if "/series" in r["path"] and r["kind"] != "recent"]
    kinds = {
        "series": [r for r in requests if r["kind"] == "series"],
        "series_in_page": [r for r in series_requests if r["kind"] == "page"],
        "recent": [r for r in requests if r["kind"] == "recent"],
    }
    for name, rs in kinds.items():
        out[name] = {
            "all": summary([r["t1"] - r["t0"] for r in rs]),
            "first_ms": rs[0]["ms"],
            "without_first": summary([r["t1"] - r["t0"] for r in rs[1:]]),
            "server_series": summary([r["parts_ms"].get("series", 0) / 1000 for r in rs]),
        }
    pages: dict[int, list[float]] = {}
    for r in requests:
        if r["kind"] == "page":
            pages.setdefault(r["ordinal"], []).append(r["t1"] - r["t0"])
    out["page"] = summary([sum(v) for v in pages.values()])
    out["gc_in_whole_series_ms"] = {
        gen: round(sum(r["gc_ms"][gen] for r in series_requests), 1) for gen in ("0", "1", "2")
    }
    out["gc_gen2_count"] = sum(1 for g in stats["gc"] if g[2] == 2)
    out["slowest_whole_series"] = [
        {k: r[k] for k in ("ordinal", "kind", "ms", "parts_ms", "gc_ms")}
        for r in sorted(series_requests, key=lambda r: -r["ms"])[:6]
    ]
    out["series_ms_in_order"] = [r["ms"] for r in kinds["series"]]
    out["gen2_ms"] = [round((b - a) * 1000, 1) for a, b, gen in stats["gc"] if gen == 2]
    out["load_avg_end"] = os.getloadavg()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database", choices=["sqlite", "postgresql"], default="sqlite")
    ap.add_argument("--intervals", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=60)
    ap.add_argument("--rounds", type=int, default=1, help="fresh servers per label, labels taking turns")
    ap.add_argument("--keep", default=None, help="keep (and reuse) the filled database under this name")
    ap.add_argument("--server-pythonpath", action="append", default=[], help="LABEL=DIR, another checkout's server")
    ap.add_argument(
        "--gc-freeze", action="store_true", help="also each server with gc.freeze() after the app's imports (a prelude)"
    )
    args = ap.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    servers: list[tuple[str, str | None, bool]] = [("head", None, False)]
    servers += [(s.split("=", 1)[0], s.split("=", 1)[1], False) for s in args.server_pythonpath]
    if args.gc_freeze:
        servers += [(f"{label}+freeze", path, True) for label, path, _ in servers]
    if args.keep:
        url = keep_url(args.database, args.keep)
        fill_s = ensure_run(url, args.intervals)
        out: dict[str, Any] = {"database": args.database, "intervals": args.intervals, "fill_s": fill_s}
        out["servers"] = [
            one_server(url, label, path, args.intervals, args.repeat, freeze)
            for _ in range(args.rounds)
            for label, path, freeze in servers
        ]
    else:
        from bench_data import scratch_database

        with scratch_database(args.database) as url:
            fill_s = ensure_run(url, args.intervals)
            out = {"database": args.database, "intervals": args.intervals, "fill_s": fill_s}
            out["servers"] = [
                one_server(url, label, path, args.intervals, args.repeat, freeze)
                for _ in range(args.rounds)
                for label, path, freeze in servers
            ]
    out["cpus"] = os.cpu_count()
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
