"""The CPU of one one-record batch POST through the app's ASGI stack, the database left out (issue
39: the per-request path of a job whose every rank sends its own record): the app as built, whose
batch route routes.ingest.BatchFastPath serves past FastAPI's inner middlewares and the router,
beside the same app built without it, in alternating rounds of one process. The batch's store is
stubbed (answered accepted at once), so what is timed is the ASGI stack, the security guards, the
body's read and check, and the answer. No sockets: uvicorn's part is not in it.

    python bench/batch_route_cost.py [--rounds 8] [--requests 2000]

Prints one JSON object: µs of CPU a request per round and their medians, and with ÷ without.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import tempfile
import time
from typing import Any

from bench_data import record

from packscope.backend.api.schemas import IngestResult
from packscope.backend.http.settings import Settings
from packscope.backend.routes import ingest
from packscope.backend.server.app import create_app

PATH = "/api/v1/runs/bench/intervals"


def app_of(database_url: str, fast_path: bool) -> Any:
    app = create_app(Settings(database_url=database_url, ingest_token=None, read_token=None))

    async def stored(_batch: object) -> IngestResult:
        return IngestResult(accepted=1, duplicates=0)

    app.state.batches.submit = stored
    app.state.live.stored = lambda _run_id: None
    app.state.alerts.wake = lambda _run_id: None
    if not fast_path:
        app.user_middleware = [m for m in app.user_middleware if m.cls is not ingest.BatchFastPath]  # type: ignore[comparison-overlap]
    return app


def scope_of(body: bytes) -> dict[str, Any]:
    headers = [(b"host", b"127.0.0.1:8000"), (b"content-type", b"application/json")]
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": PATH,
        "raw_path": PATH.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [*headers, (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
        "state": {},
    }


async def post(app: Any, body: bytes) -> None:
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": body, "more_body": False}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    await app(scope_of(body), receive, send)
    assert sent[0]["status"] == 200, sent


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    body = json.dumps({"intervals": [record(3, 5, random.Random(1))]}).encode()
    with tempfile.TemporaryDirectory() as tmp:
        apps = {name: app_of(f"sqlite:///{tmp}/{name}.db", name == "with") for name in ("with", "without")}
        rounds: dict[str, list[float]] = {name: [] for name in apps}
        for app in apps.values():
            app.middleware_stack = app.build_middleware_stack()
        for r in range(args.rounds):
            for name in list(apps) if r % 2 == 0 else list(apps)[::-1]:
                for _ in range(args.requests // 10):  # warm
                    await post(apps[name], body)
                cpu0 = time.process_time()
                for _ in range(args.requests):
                    await post(apps[name], body)
                rounds[name].append(round((time.process_time() - cpu0) / args.requests * 1e6, 1))
    medians = {name: statistics.median(v) for name, v in rounds.items()}
    return {
        "requests_per_round": args.requests,
        "cpu_us_per_request": rounds,
        "median_us": medians,
        "with_over_without": round(medians["with"] / medians["without"], 3),
        "load_avg_end": os.getloadavg(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--requests", type=int, default=2000)
    args = parser.parse_args()
    out = {"date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), "load_avg_start": os.getloadavg()}
    out.update(asyncio.run(measure(args)))
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
