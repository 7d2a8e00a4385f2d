"""Fixtures for the end-to-end tests: the real FastAPI backend under a real uvicorn server, run in
a thread on a loopback port over a temporary SQLite file, which a test can stop and start again
(same port, same database) to simulate an outage."""

from __future__ import annotations

import csv
import io
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch
import uvicorn

from packscope.backend.http.settings import Settings
from packscope.backend.server.app import create_app
from packscope.core.ports import free_port


class Backend:
    """packscope's backend in a uvicorn thread. ``stop()`` and ``start()`` may alternate; every
    start builds a fresh app (as a restarted server process would) over the same database file and
    listens on the same port."""

    def __init__(self, database_url: str, port: int) -> None:
        self.database_url = database_url
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def running(self) -> bool:
        return self._server is not None

    def start(self) -> Backend:
        assert self._server is None, "already running"
        # Explicit tokens, so PACKSCOPE_* variables of the machine running the tests do not leak in.
        settings = Settings(database_url=self.database_url, ingest_token=None, read_token=None)
        config = uvicorn.Config(
            create_app(settings),
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            timeout_graceful_shutdown=2,
        )
        server = uvicorn.Server(config)
        thread = threading.Thread(target=server.run, name=f"uvicorn-{self.port}", daemon=True)
        thread.start()
        deadline = time.monotonic() + 15
        while not server.started:
            if not thread.is_alive():
                raise RuntimeError(f"uvicorn exited before it started on port {self.port}")
            assert time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)
        self._server, self._thread = server, thread
        return self

    def stop(self) -> None:
        if self._server is None:
            return
        assert self._thread is not None
        self._server.should_exit = True
        self._thread.join(15)
        assert not self._thread.is_alive(), "uvicorn did not stop"
        self._server = self._thread = None
        # Nothing listens on the port any more: a connection is refused, not served.
        with pytest.raises(httpx.ConnectError):
            httpx.get(self.url + "/api/v1/runs", timeout=2)

    # -- reads ---------------------------------------------------------------------------------
    def get(self, path: str, **params: Any) -> Any:
        response = httpx.get(self.url + path, params=params, timeout=10)
        assert response.status_code == 200, (path, response.status_code, response.text)
        return response.json()

    def csv_rows(self, run_id: str) -> list[dict[str, str]]:
        response = httpx.get(f"{self.url}/api/v1/runs/{run_id}/intervals.csv", timeout=10)
        assert response.status_code == 200, response.text
        assert response.headers["content-type"].startswith("text/csv")
        return list(csv.DictReader(io.StringIO(response.text)))


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'packscope-e2e.db'}"


@pytest.fixture
def make_backend(sqlite_url: str) -> Iterator[Callable[[], Backend]]:
    """make_backend() -> a started Backend on a free loopback port over a temporary SQLite file."""
    made: list[Backend] = []

    def build() -> Backend:
        backend = Backend(sqlite_url, free_port()).start()
        made.append(backend)
        return backend

    yield build
    for backend in made:
        backend.stop()


@pytest.fixture
def backend(make_backend: Callable[[], Backend]) -> Backend:
    return make_backend()


@pytest.fixture(autouse=True)
def _one_intra_op_thread() -> Iterator[None]:
    """The server runs as a thread of the test process, next to the trainer. With torch's intra-op
    pool as wide as the machine (2 cores here), CPU training then stalls now and then, 5-30x slower
    for a whole run (measured; not seen with the same server in a separate process, nor with one
    intra-op thread). One intra-op thread keeps the runtime steady; it changes no number checked."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
