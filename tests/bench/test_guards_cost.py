"""bench/guards_cost.py times what it says: each stack lets the ingest POST through to the bare
app, so a refusal is never what gets timed."""

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))  # the benchmarks import it as a sibling
import guards_cost


def first_answer(app):
    sent = []

    async def send(message):
        sent.append(message)

    asyncio.run(app(dict(guards_cost._SCOPE), guards_cost._receive, send))
    return sent[0]


def test_every_stack_passes_the_post_to_the_app():
    middlewares = guards_cost.app_middlewares()
    assert {m.cls.__name__ for m in middlewares} >= {"SignInGuard", "SecurityHeaders", "TokenGuard", "WriteGuard"}
    for names in guards_cost.STACKS.values():
        start = first_answer(guards_cost.stack(middlewares, names))
        assert start["type"] == "http.response.start" and start["status"] == 202
