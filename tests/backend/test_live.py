"""Against a real uvicorn server: the live stream (SSE) and `packscope export`."""

import argparse
import csv
import io
import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest
import uvicorn

from packscope.backend.app import create_app
from packscope.backend.cli import add_export_arguments, export_from_args
from packscope.backend.settings import Settings


@pytest.fixture
def server(sqlite_url: str) -> Iterator[str]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = Settings(
        database_url=sqlite_url, ingest_token=None, read_token=None, stream_poll_s=0.05, stream_keepalive_s=0.3
    )
    app = create_app(settings)
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=2)
    instance = uvicorn.Server(config)
    thread = threading.Thread(target=instance.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not instance.started:
        assert time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    yield f"http://127.0.0.1:{port}"
    instance.should_exit = True
    thread.join(10)


def export(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    add_export_arguments(parser)
    return export_from_args(parser.parse_args(argv))


def test_stream_sends_an_event_when_intervals_arrive(server, new_run, records):
    http = httpx.Client(base_url=server, timeout=5)
    http.post("/api/v1/runs", json=new_run())
    assert http.get("/api/v1/runs/nope/stream").status_code == 404
    http.post("/api/v1/runs/run-1/intervals", json={"intervals": records(2)})

    events: list[dict] = []
    comments = 0
    with http.stream("GET", "/api/v1/runs/run-1/stream") as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        lines = response.iter_lines()
        for line in lines:
            if line == "event: interval":
                events.append(json.loads(next(lines).removeprefix("data: ")))
                if len(events) == 1:  # the state when the stream opened, then something new
                    http.post("/api/v1/runs/run-1/intervals", json={"intervals": records(3, start=2)})
                else:
                    break
            elif line.startswith(":"):
                comments += 1
    assert events == [
        {"run_id": "run-1", "interval": 1, "last_step": 20},
        {"run_id": "run-1", "interval": 4, "last_step": 50},
    ]
    http.close()


def test_stream_keeps_the_connection_alive(server, new_run):
    http = httpx.Client(base_url=server, timeout=5)
    http.post("/api/v1/runs", json=new_run())
    with http.stream("GET", "/api/v1/runs/run-1/stream") as response:
        first = next(line for line in response.iter_lines() if line)
    assert first.startswith(":")  # no intervals yet: only keep-alive comments
    http.close()


def test_export_writes_the_csv(server, tmp_path, new_run, records, capsys):
    httpx.post(f"{server}/api/v1/runs", json=new_run())
    httpx.post(f"{server}/api/v1/runs/run-1/intervals", json={"intervals": records(25)})
    target = tmp_path / "out.csv"
    assert export(["--server", server, "--run", "run-1", "-o", str(target)]) == 0
    rows = list(csv.DictReader(io.StringIO(target.read_text())))
    assert [int(r["interval"]) for r in rows] == list(range(25))
    assert "wrote 25 intervals" in capsys.readouterr().err


def test_export_explains_user_errors(server, tmp_path, capsys):
    target = tmp_path / "out.csv"
    assert export(["--server", server, "--run", "missing", "-o", str(target)]) == 2
    assert "run 'missing' is not stored" in capsys.readouterr().err
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        closed = f"http://127.0.0.1:{s.getsockname()[1]}"
    assert export(["--server", closed, "--run", "run-1", "-o", str(target)]) == 2
    assert "cannot reach the packscope server" in capsys.readouterr().err
    assert not target.exists() and not (tmp_path / "out.csv.part").exists()
