"""bench/guards_cost.py times what it says: each stack lets the ingest POST through to the bare
app (a refusal would be timed instead), and the full stack holds every guard create_app adds."""

import asyncio
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))  # the benchmarks import it as a sibling
import guards_cost

from packscope.backend.app import create_app
from packscope.backend.settings import Settings


def answers(app):
    sent = []

    async def send(message):
        sent.append(message)

    asyncio.run(app(dict(guards_cost._SCOPE), guards_cost._receive, send))
    return sent


def test_every_stack_passes_the_post_to_the_app():
    for guards in guards_cost.STACKS.values():
        start = answers(guards_cost.stack(guards))[0]
        assert start["type"] == "http.response.start" and start["status"] == 202


def test_the_full_stack_is_the_apps_guards(tmp_path):
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'p.db'}"))
    added = {m.cls.__name__ for m in app.user_middleware}
    app.state.engine.dispose()
    full = guards_cost.stack(guards_cost.STACKS["all four"])
    wrapped = set()
    while hasattr(full, "app"):
        wrapped.add(type(full).__name__)
        full = full.app
    assert wrapped == added
