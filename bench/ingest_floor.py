"""The ingest path against its floors: how far the server's CPU per row is from the least any
Python server on this stack must spend on the same batches, measured side by side in one run.

Issue 8 asks for ≤ 20 µs of server CPU per interval row (batches of 64). Whether that is reachable
depends on the machine as much as on the code (the same code measured 54 µs/row on one 2-core
machine and 130 on another), so this benchmark prices the parts no design can skip, on the machine
it runs on, next to the real path:

* decode_untyped: msgspec's JSON decode of the body into plain Python objects, no types, no
  checks: less than any validation can cost;
* parse: the route's own decode, checks and row layout (rows.parse);
* rows_floor: the parsed rows kept by sqlite3 in the least way a row per interval allows: one
  table of the same columns plus the details' text, no index beyond the rowid, one transaction
  per batch (WAL, synchronous=NORMAL, as the server's engine sets them);
* blob_floor: the batch kept as one row instead, its numbers one float64 array and its details
  one text: the floor of a columnar layout;
* rows_once_floor: rows_floor with what exactly-once storage cannot skip: a unique index on
  (run, interval, rank) and INSERT OR IGNORE, so a replayed record is not stored twice;
* store: the real store of those rows (ingest.ingest_together on a migrated schema: idempotency
  index, details, rollups, totals, sync sites, one transaction per batch);
* http_floor: server CPU per row of a bare ASGI app under the same uvicorn that reads the body and
  answers (a subprocess; CPU from /proc);
* fastapi_floor: the same for a FastAPI app with one POST route that reads the body and answers
  (the framework the project is built on, with nothing of packscope's);
* server: server CPU per row of packscope's app under uvicorn, the same bodies, a new run per round.

And the SQLite CSV export against its own floor (issue 8 asks for ≥ 200,000 rows/s), on a run of
--csv-rows intervals stored by the same store:

* csv_fetch_floor: every column the export stores, SELECTed through sqlite3, fetched in the
  export's chunks and dropped: rows/s that no formatting can exceed while sqlite3 hands out every
  cell (since 2026-12-03 the export does not fetch a column that held one value through its
  previous chunk, so on runs with such columns it can pass this floor);
* csv_export: the export itself (csv_export.csv_bytes, in process), rows/s.

The parts run in rounds, in a rotated order each round, so drift on a shared machine spreads
over all of them. Per part: the median, min and max µs/row over the rounds. Then two floors,
decode_untyped + http_floor + rows_floor (and + blob_floor), and the server's ratio to each; and
a third, what issue 22's other demands force on any design that keeps a row per interval and
serves it with FastAPI: the typed parse (a 422 that names the field needs the checks) +
fastapi_floor + rows_once_floor (nothing stored twice), with the server's ratio to it and what is
left between them.

    python bench/ingest_floor.py [--batches 100] [--rounds 5] [--csv-rows 100000]

SQLite only: PostgreSQL's floor would also include its server process. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import operator
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import msgspec
import numpy as np
from backend_scale import BATCH, cpu_seconds, start_server, store_renumbered, wait_until_serving
from bench_data import record, run_body

from packscope.backend.api.schemas import RunCreate
from packscope.backend.ingest.batches import create_or_resume_run, ingest_together
from packscope.backend.ingest.rows import ROW_COLUMNS, Parsed, parse
from packscope.backend.reads.csv_export import CSV_CHUNK_ROWS, _sqlite_query, csv_bytes
from packscope.backend.store.db import SQLITE_PRAGMAS, WRITES, make_engine, make_sessionmaker, upgrade_schema
from packscope.backend.store.runs import get_run
from packscope.core.ports import free_port

GOAL_US_PER_ROW = 20.0
FLOOR_RATIO_GOAL = 1.5  # issue 22: server CPU per row within 1.5x the row floor
HTTP_PASSES = 10
CSV_GOAL_ROWS_PER_S = 200_000

# A bare ASGI app: read the whole body, answer what the real route answers for a clean batch.
_BARE_APP = textwrap.dedent(
    """
    import sys, uvicorn
    ANSWER = b'{"accepted":64,"duplicates":0}'
    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        more = True
        while more:
            message = await receive()
            more = message.get("more_body", False)
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": ANSWER})
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    """
)

# The same under FastAPI: one POST route, the body read, the answer as it is.
_FASTAPI_APP = textwrap.dedent(
    """
    import sys, uvicorn
    from fastapi import FastAPI, Request, Response
    app = FastAPI()
    ANSWER = b'{"accepted":64,"duplicates":0}'
    @app.post("/api/v1/runs/{run_id}/intervals")
    async def post(run_id: str, request: Request) -> Response:
        await request.body()
        return Response(ANSWER, media_type="application/json")
    @app.get("/api/v1/catalogue")  # what wait_until_serving asks
    async def ready() -> dict:
        return {}
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
    """
)


def python_probe_s() -> float:
    """CPU seconds of a fixed pure-Python loop: the machine's speed, to set figures from different
    machines side by side (the log docs/benchmarks/ gives it with each run of this benchmark)."""
    t0 = time.process_time()
    sum(i * i for i in range(2_000_000))
    return time.process_time() - t0


def _sqlite(path: Path) -> sqlite3.Connection:
    # The server engine's pragmas; transactions opened by hand, as the server does.
    connection = sqlite3.connect(path, isolation_level=None)
    for pragma in SQLITE_PRAGMAS:
        connection.execute(pragma)
    return connection


class RowsFloor:
    """A row per interval, nothing else: the rows' values and their details' text."""

    def __init__(self, path: Path) -> None:
        self.db = _sqlite(path)
        columns = ", ".join(f'"{c}"' for c in (*ROW_COLUMNS, "histograms", "sync_sites"))
        self.db.execute(f"CREATE TABLE flat ({columns})")
        self.sql = f"INSERT INTO flat VALUES ({', '.join('?' * (len(ROW_COLUMNS) + 2))})"
        self.run_pk = 1

    def __call__(self, parsed: Parsed) -> None:
        encode = msgspec.json.encode
        rows = [
            (self.run_pk, *values, histograms, encode(sites).decode())
            for values, histograms, sites in zip(parsed.values, parsed.histograms, parsed.sites, strict=True)
        ]
        self.db.execute("BEGIN")
        self.db.executemany(self.sql, rows)
        self.db.execute("COMMIT")


class RowsOnceFloor(RowsFloor):
    """RowsFloor whose key (run, interval, rank) is unique, a replayed row skipped: the least
    exactly-once storage of a row per interval costs (no RETURNING: which rows were new is not
    asked, where the server must know it to feed only those to the aggregates)."""

    def __init__(self, path: Path) -> None:
        super().__init__(path)
        self.db.execute('CREATE UNIQUE INDEX flat_key ON flat ("run_pk", "interval", "rank")')
        self.sql = self.sql.replace("INSERT INTO", "INSERT OR IGNORE INTO", 1)

    def new_run(self) -> RowsOnceFloor:
        """The next round's rows under a run of their own: new keys, as the server's rounds."""
        self.run_pk += 1
        return self


class BlobFloor:
    """A row per batch: its numbers as one float64 array, its details as one JSON text."""

    def __init__(self, path: Path) -> None:
        self.db = _sqlite(path)
        self.db.execute("CREATE TABLE batches (run_pk, numbers BLOB, details TEXT)")
        # The numeric columns of a row (channel_loss and channel_tokens are JSON text).
        self.numeric = operator.itemgetter(
            *(i for i, c in enumerate(ROW_COLUMNS[1:]) if c not in ("channel_loss", "channel_tokens"))
        )

    def __call__(self, parsed: Parsed) -> None:
        numbers = np.array(list(map(self.numeric, parsed.values)), dtype=float)  # None -> NaN
        details = msgspec.json.encode([parsed.histograms, parsed.sites, parsed.channels]).decode()
        self.db.execute("BEGIN")
        self.db.execute("INSERT INTO batches VALUES (?, ?, ?)", (1, numbers.tobytes(), details))
        self.db.execute("COMMIT")


def _start_app(source: str) -> tuple[subprocess.Popen[bytes], str]:
    """One of the bare apps above in a process of its own, on a free port; (process, URL)."""
    port = free_port()
    return subprocess.Popen([sys.executable, "-c", source, str(port)]), f"http://127.0.0.1:{port}"


def _in_process(work: Callable[[Any], object], items: list[Any]) -> float:
    """CPU µs per row of `work` over `items` (one batch of BATCH rows each)."""
    t0 = time.process_time()
    for item in items:
        work(item)
    return (time.process_time() - t0) / (len(items) * BATCH) * 1e6


def _over_http(url: str, pid: int, path: str, bodies: list[bytes]) -> float:
    """Server CPU µs per row of posting `bodies` to `path`, one after another on one connection."""
    with httpx.Client(base_url=url, timeout=60) as client:
        client.post(path, content=bodies[0], headers={"Content-Type": "application/json"})  # connect, warm
        cpu0 = cpu_seconds(pid)
        for body in bodies[1:]:
            response = client.post(path, content=body, headers={"Content-Type": "application/json"})
            if response.status_code != 200:
                raise SystemExit(f"{path} answered {response.status_code}: {response.text[:200]}")
        return (cpu_seconds(pid) - cpu0) / ((len(bodies) - 1) * BATCH) * 1e6


def _fill(make_session: Any, run_id: str, rows: int) -> int:
    """Store a run of `rows` intervals (backend_scale's re-numbered records); its primary key."""
    with make_session() as session:
        run, _ = create_or_resume_run(session, RunCreate.model_validate(run_body(run_id)))
        run_pk = int(run.id)
    rng = random.Random(4)
    template = [record(i, 0, rng) for i in range(BATCH)]
    store_renumbered(make_session, run_id, template, rows)
    return run_pk


def _csv_rates(engine: Any, make_session: Any, run_id: str, run_pk: int, rows: int) -> dict[str, Callable[[], float]]:
    """The two CSV parts, each a function giving rows/s (wall clock: the export is one thread)."""

    def fetch_floor() -> float:
        t0 = time.perf_counter()
        with engine.connect() as connection:
            cursor = connection.connection.driver_connection.cursor()
            cursor.execute(_sqlite_query(run_pk))
            fetched = 0
            while chunk := cursor.fetchmany(CSV_CHUNK_ROWS):
                fetched += len(chunk)
            cursor.close()
        assert fetched == rows, fetched
        return rows / (time.perf_counter() - t0)

    def export() -> float:
        t0 = time.perf_counter()
        with make_session() as session:
            run = get_run(session, run_id)
            assert run is not None
            lines = 0
            for piece in csv_bytes(session, run):
                lines += bytes(piece).count(b"\n")
        assert lines == rows + 1, lines
        return rows / (time.perf_counter() - t0)

    return {"csv_fetch_floor": fetch_floor, "csv_export": export}


def measure(batches: int, rounds: int, csv_rows: int, scratch: Path) -> dict[str, Any]:
    rng = random.Random(3)
    bodies = [
        json.dumps({"intervals": [record(b * BATCH + i, 0, rng) for i in range(BATCH)]}).encode()
        for b in range(batches)
    ]
    parsed = [parse(body) for body in bodies]

    engine = make_engine(f"sqlite:///{scratch / 'store.db'}")
    upgrade_schema(engine)
    writes = engine.execution_options(**{WRITES: True})
    make_session = make_sessionmaker(engine)
    server, url = start_server(f"sqlite:///{scratch / 'server.db'}")
    bare, bare_url = _start_app(_BARE_APP)
    fastapi, fastapi_url = _start_app(_FASTAPI_APP)
    try:
        wait_until_serving(bare, bare_url)  # the bare app answers any path
        wait_until_serving(fastapi, fastapi_url)
        http = httpx.Client(base_url=url, timeout=60)
        rows_floor, blob_floor = RowsFloor(scratch / "rows.db"), BlobFloor(scratch / "blob.db")
        rows_once_floor = RowsOnceFloor(scratch / "rows_once.db")
        runs = iter(range(10**6))

        def store_round() -> float:
            run_id = f"store-{next(runs)}"
            with make_session() as session:
                create_or_resume_run(session, RunCreate.model_validate(run_body(run_id)))

            def store(p: Parsed) -> None:
                assert ingest_together(writes, [(run_id, p)])[0] is not None  # None: the run is not stored

            return _in_process(store, parsed)

        def server_round() -> float:
            run_id = f"server-{next(runs)}"
            assert http.post("/api/v1/runs", json=run_body(run_id)).status_code == 201
            return _over_http(url, server.pid, f"/api/v1/runs/{run_id}/intervals", bodies)

        csv_pk = _fill(make_session, "csv", csv_rows)
        csv_parts = _csv_rates(engine, make_session, "csv", csv_pk, csv_rows)
        parts: dict[str, Callable[[], float]] = {
            "decode_untyped": lambda: _in_process(msgspec.json.decode, bodies),
            "parse": lambda: _in_process(parse, bodies),
            "rows_floor": lambda: _in_process(rows_floor, parsed),
            "blob_floor": lambda: _in_process(blob_floor, parsed),
            "rows_once_floor": lambda: _in_process(rows_once_floor.new_run(), parsed),
            "store": store_round,
            # The bare apps store nothing: their bodies go round HTTP_PASSES times, so their few
            # µs a row span many of /proc's 10 ms CPU ticks.
            "http_floor": lambda: _over_http(bare_url, bare.pid, "/", bodies * HTTP_PASSES),
            "fastapi_floor": lambda: _over_http(
                fastapi_url, fastapi.pid, "/api/v1/runs/r/intervals", bodies * HTTP_PASSES
            ),
            "server": server_round,
        }
        parts.update(csv_parts)
        names = list(parts)
        samples: dict[str, list[float]] = {name: [] for name in names}
        load = [os.getloadavg()[0]]
        probe = [python_probe_s()]
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                samples[name].append(parts[name]())
            load.append(os.getloadavg()[0])
            probe.append(python_probe_s())
            print(f"round {r + 1}/{rounds} done", file=sys.stderr)
    finally:
        for process in (server, bare, fastapi):
            process.terminate()
            process.wait(10)
        engine.dispose()

    rates = {name: samples.pop(name) for name in csv_parts}
    median = {name: statistics.median(values) for name, values in samples.items()}
    rows_floor_total = median["decode_untyped"] + median["http_floor"] + median["rows_floor"]
    blob_floor_total = median["decode_untyped"] + median["http_floor"] + median["blob_floor"]
    required_total = median["parse"] + median["fastapi_floor"] + median["rows_once_floor"]
    return {
        "machine": {
            "cpus": os.cpu_count(),
            "python": sys.version.split()[0],
            "python_probe_s": {"min": round(min(probe), 3), "max": round(max(probe), 3)},
        },
        "batches": batches,
        "rows_per_batch": BATCH,
        "rounds": rounds,
        "load_avg_1m": {"min": min(load), "max": max(load)},
        "us_per_row": {
            name: {"median": round(median[name], 2), "min": round(min(v), 2), "max": round(max(v), 2)}
            for name, v in samples.items()
        },
        "floor_rows_us_per_row": round(rows_floor_total, 2),
        "floor_blob_us_per_row": round(blob_floor_total, 2),
        "goal_us_per_row": GOAL_US_PER_ROW,
        "server_over_floor_rows": round(median["server"] / rows_floor_total, 2),
        "server_over_floor_blob": round(median["server"] / blob_floor_total, 2),
        "floor_required_us_per_row": round(required_total, 2),
        "server_over_floor_required": round(median["server"] / required_total, 2),
        # What the server spends beyond the required floor, and what the goal leaves for that:
        # the aggregates, the details' table, the run lookup, the transaction.
        "server_beyond_required_us_per_row": round(median["server"] - required_total, 2),
        "room_at_1_5x_row_floor_us_per_row": round(FLOOR_RATIO_GOAL * rows_floor_total - required_total, 2),
        "floor_rows_over_goal": round(rows_floor_total / GOAL_US_PER_ROW, 2),
        "floor_blob_over_goal": round(blob_floor_total / GOAL_US_PER_ROW, 2),
        "csv": {
            "rows": csv_rows,
            "rows_per_s": {
                name: {"median": round(statistics.median(v)), "min": round(min(v)), "max": round(max(v))}
                for name, v in rates.items()
            },
            "goal_rows_per_s": CSV_GOAL_ROWS_PER_S,
            "export_over_fetch_floor": round(
                statistics.median(rates["csv_export"]) / statistics.median(rates["csv_fetch_floor"]), 2
            ),
            "fetch_floor_over_goal": round(statistics.median(rates["csv_fetch_floor"]) / CSV_GOAL_ROWS_PER_S, 2),
        },
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batches", type=int, default=100, help="batches of 64 rows per part per round")
    ap.add_argument("--rounds", type=int, default=5, help="rounds of every part, in rotated order")
    ap.add_argument("--csv-rows", type=int, default=100_000, help="intervals of the run the CSV parts export")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        print(json.dumps(measure(args.batches, args.rounds, args.csv_rows, Path(tmp)), indent=2))


if __name__ == "__main__":
    main()
