"""What the security guards (backend/http/security.py) cost a request, apart from everything else.

The middlewares create_app adds (with its default settings) wrap a bare ASGI app that answers 202
at once, in three stacks: none, the two that 69cdf22 had (security headers, the sign-in
throttle), and every one of today's (issue 22 added the write-origin check and the token
throttle). Each stack serves the same authorised ingest POST --requests times in one event loop,
in rounds whose order rotates; CPU time (process_time) per request, and per interval row at
--rows-per-request rows a batch (64, the agent's default).

    python bench/guards_cost.py [--requests 20000] [--rounds 5] [--rows-per-request 64]

Prints one JSON object: per stack the median, min and max µs a request over the rounds, and the
median µs a row.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from starlette.middleware import Middleware
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from packscope.backend.http.settings import Settings
from packscope.backend.routes.ingest import BatchFastPath
from packscope.backend.server.app import create_app

_SCOPE: Scope = {
    "type": "http",
    "method": "POST",
    "path": "/api/v1/runs/bench/intervals",
    "client": ("127.0.0.1", 50000),
    "headers": [
        (b"host", b"127.0.0.1:8000"),
        (b"content-type", b"application/json"),
        (b"authorization", b"Bearer token"),
        (b"content-length", b"50000"),
    ],
}


async def _answer(_scope: Scope, _receive: Receive, send: Send) -> None:
    await send({"type": "http.response.start", "status": 202, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b"{}"})


async def _receive() -> Message:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _send(_message: Message) -> None:
    pass


def app_middlewares() -> list[Middleware]:
    """The middlewares of an app create_app builds with the default settings (and an ingest token),
    innermost first, but BatchFastPath: it is the batch route's own dispatch (it would serve the
    post itself instead of passing it to the bare app these stacks wrap), not a guard."""
    with tempfile.TemporaryDirectory() as folder:
        app = create_app(Settings(database_url=f"sqlite:///{Path(folder) / 'guards.db'}", ingest_token="bench"))
        app.state.engine.dispose()
    dispatch: object = BatchFastPath
    return [m for m in reversed(app.user_middleware) if m.cls is not dispatch]


# The middlewares of each stack, by class name; None: every one create_app adds.
STACKS: dict[str, tuple[str, ...] | None] = {
    "none": (),
    "69cdf22's two (headers, sign-in)": ("SignInGuard", "SecurityHeaders"),
    "today's": None,
}


def stack(middlewares: list[Middleware], names: tuple[str, ...] | None) -> ASGIApp:
    """The bare app inside those of `middlewares` (innermost first) that `names` names."""
    app: ASGIApp = _answer
    for middleware in middlewares:
        cls, args, kwargs = middleware
        if names is None or cls.__name__ in names:
            app = cls(app, *args, **kwargs)
    return app


async def _serve(app: ASGIApp, requests: int) -> None:
    for _ in range(requests):
        await app(dict(_SCOPE), _receive, _send)


def cpu_us_per_request(app: ASGIApp, requests: int) -> float:
    start = time.process_time()
    asyncio.run(_serve(app, requests))
    return (time.process_time() - start) / requests * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--rows-per-request", type=int, default=64)
    args = parser.parse_args()
    middlewares = app_middlewares()
    apps = {name: stack(middlewares, names) for name, names in STACKS.items()}
    samples: dict[str, list[float]] = {name: [] for name in STACKS}
    names = list(STACKS)
    for round_ in range(args.rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            samples[name].append(cpu_us_per_request(apps[name], args.requests))
    out: dict[str, Any] = {"requests": args.requests, "rounds": args.rounds, "rows_per_request": args.rows_per_request}
    for name, values in samples.items():
        median = statistics.median(values)
        out[name] = {
            "us_per_request": {"median": round(median, 2), "min": round(min(values), 2), "max": round(max(values), 2)},
            "us_per_row": round(median / args.rows_per_request, 4),
        }
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
