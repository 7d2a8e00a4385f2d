"""A real uvicorn server in a thread of the test process, run with `packscope serve`'s options
(backend/server/serving.py): what TestClient cannot show (sockets, timeouts, client addresses, streams)."""

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import uvicorn

from packscope.backend.http.settings import Settings
from packscope.backend.server.app import create_app
from packscope.backend.server.serving import uvicorn_options
from packscope.core.ports import free_port


@contextmanager
def serving(settings: Settings) -> Iterator[str]:
    """The base URL of a server over `settings`, stopped afterwards."""
    port = free_port()
    config = uvicorn.Config(
        create_app(settings), host="127.0.0.1", port=port, log_level="warning", **uvicorn_options(settings)
    )
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
