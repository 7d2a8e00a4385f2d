"""What the browser tests share (pytest puts tests/ on the path): a real server on a free port,
run bodies, and a wait that the pages' CSP allows."""

import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from playwright import sync_api

from packscope.core.ports import free_port

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]


def require_chromium() -> None:
    """Skip where Debian's chromium is missing; under CI, which installs it, fail instead."""
    import pytest

    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing: apt-get install -y chromium (make test does, as root)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs it: a missing browser there is a broken set-up
        pytest.skip(message)


MODEL = {"layers": 4, "hidden": 512, "heads": 8, "ffn": 2048, "vocab": 32000}


def run_body(run_id: str, name: str | None = None, **extra: Any) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "name": name or run_id,
        "model": MODEL,
        "layout": "thd",
        "hardware": {"gpu_name": "NVIDIA H200", "gpu_count": 1, "peak_tflops": 989.0},
        **extra,
    }


@contextmanager
def running_server(db: Path, **env: str) -> Iterator[str]:
    """`packscope`'s app under uvicorn on a free port over the SQLite file `db`; yields its base URL."""
    port = free_port()
    environment = {k: v for k, v in os.environ.items() if not k.startswith("PACKSCOPE_")}
    environment.update({"PACKSCOPE_DATABASE_URL": f"sqlite:///{db}", **env})
    command = [sys.executable, "-m", "uvicorn", "--factory", "packscope.backend.server.app:create_app"]
    command += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"]
    # Not from the checkout: its alembic/ folder would shadow the alembic package.
    process = subprocess.Popen(command, env=environment, cwd=db.parent)
    base = f"http://127.0.0.1:{port}"
    # A server with a read token answers reads only with it.
    token = env.get("PACKSCOPE_READ_TOKEN")
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{base}/api/v1/runs", headers=headers).raise_for_status()
                break
            except httpx.HTTPError:
                assert process.poll() is None, "the server exited while starting"
                assert time.monotonic() < deadline, "the server did not answer within 30 s"
                time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=10)


def until(page: sync_api.Page, expression: str, timeout: float = 15_000) -> None:
    """Waits for a JS expression to be true. Passed as a function: the pages' CSP (script-src 'self')
    forbids the eval that Playwright uses for a bare expression. An expression that throws (an
    element the page has not drawn yet: `null.textContent`) counts as not yet true: a throwing
    predicate would fail wait_for_function at once, a race with the page's first fetch."""
    try:
        guarded = f"() => {{ try {{ return ({expression}); }} catch {{ return false; }} }}"
        page.wait_for_function(guarded, timeout=timeout)
    except sync_api.TimeoutError:
        # A file of its own: tests run side by side, and beside other checkouts' test runs.
        fd, shot = tempfile.mkstemp(prefix="packscope-browser-failure-", suffix=".png")
        os.close(fd)
        page.screenshot(path=shot, full_page=True)
        errors = getattr(page, "errors", [])
        raise AssertionError(f"never true: {expression}; page errors: {errors}; screenshot: {shot}") from None


# With plotly.js held, a page that asks for it before its load event never fires that event:
# wait for the document only (the tests then wait for what they check).
HELD = "domcontentloaded"


class HeldPlotly:
    """Holds the page's request for plotly.js until release()."""

    def __init__(self, page):
        self.routes = []
        page.route("**/vendor/plotly.min.js", self.hold)

    def hold(self, route):
        self.routes.append(route)

    def release(self, page):
        until(page, "document.querySelector('script[src=\"/vendor/plotly.min.js\"]') !== null")
        # The route handler runs in this process when Playwright next hands it events: wait for it
        # (a fixed pause lost that race on a loaded machine).
        for _ in range(750):
            if self.routes:
                break
            page.wait_for_timeout(20)
        assert self.routes, "the page never asked for plotly.js"
        for route in self.routes:
            route.continue_()


def vertices(d):
    """An SVG path's points as flat [x0, y0, x1, y1, ...], one list per "M"-started run."""
    return [[float(v) for p in run.split("L") for v in p.split()] for run in d.split("M") if run]


def flat(points):
    return [v for point in points for v in point]


def sketch_scale(sketch):
    left, top, width, height = sketch["area"]
    (x0, x1), (y0, y1) = sketch["x"], sketch["y"]
    return (
        lambda x: round(left + (x - x0) / (x1 - x0) * width, 2),
        lambda y: round(top + height - (y - y0) / (y1 - y0) * height, 2),
    )
