"""Against a real uvicorn server: the live stream (SSE) and its push between server processes
(`packscope export` is tested as a command, in tests/cli/test_run_commands.py)."""

import asyncio
import contextlib
import json
import queue
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from packscope.backend.http.live import InProcess, LiveHub, UnixDatagrams, transport_for
from packscope.backend.http.settings import Settings
from packscope.backend.store.db import make_engine
from tests.backend.uvicorn_server import serving


@pytest.fixture
def server(sqlite_url: str) -> Iterator[str]:
    settings = Settings(
        database_url=sqlite_url, ingest_token=None, read_token=None, stream_poll_s=0.05, stream_keepalive_s=0.3
    )
    with serving(settings) as url:
        yield url


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
    # The second event follows one the stream sent: it carries the new intervals' series.
    series = events[1].pop("series")
    assert events == [
        {"run_id": "run-1", "interval": 1, "last_step": 20},
        {"run_id": "run-1", "interval": 4, "last_step": 50, "after_step": 20},
    ]
    assert series["columns"]["step"] == [30, 40, 50]
    http.close()


def read_events(url: str, run_id: str, into: queue.Queue, opened: threading.Event, stamped: bool = False) -> None:
    """Every event of the run's stream into `into` (with its arrival time if `stamped`), until the
    server stops."""
    with (
        contextlib.suppress(httpx.HTTPError),
        httpx.stream("GET", f"{url}/api/v1/runs/{run_id}/stream", timeout=30) as answer,
    ):
        opened.set()
        lines = answer.iter_lines()
        for line in lines:
            if line == "event: interval":
                event = json.loads(next(lines).removeprefix("data: "))
                into.put((time.monotonic(), event) if stamped else event)


def test_an_event_carries_what_the_series_endpoint_answers_for_its_intervals(database_url, new_run, records):
    """The run page extends its charts from the event's series without asking (issue 39): they
    must be the series endpoint's values for the same intervals, and the page's own request
    (step_min past what it holds) must answer them too."""
    with serving(Settings(database_url=database_url, **NO_POLL)) as url:
        http = httpx.Client(base_url=url, timeout=10)
        assert http.post("/api/v1/runs", json=new_run()).status_code == 201
        http.post("/api/v1/runs/run-1/intervals", json={"intervals": records(3)})
        got: queue.Queue[dict] = queue.Queue()
        opened = threading.Event()
        threading.Thread(target=read_events, args=(url, "run-1", got, opened), daemon=True).start()
        assert opened.wait(10)
        assert "series" not in got.get(timeout=10)  # the state when it opened: the page has it
        for start, n in ((3, 1), (4, 5), (9, 2)):
            batch = {"intervals": records(n, start=start, seed=start)}
            assert http.post("/api/v1/runs/run-1/intervals", json=batch).status_code == 200
            event = got.get(timeout=10)
            assert (event["interval"], event["after_step"]) == (start + n - 1, start * 10)
            asked = {"max_points": 500, "step_min": event["after_step"] + 1}
            exact = http.get("/api/v1/runs/run-1/series", params={**asked, "step_max": event["last_step"]}).json()
            pages = http.get("/api/v1/runs/run-1/series", params=asked).json()
            assert event["series"] == exact == pages
            assert event["series"]["points"] == n
            assert event["series"]["columns"]["tflops_useful"][-1] is not None
        whole = http.get("/api/v1/runs/run-1/series", params={"max_points": 500}).json()
        assert whole["columns"]["step"] == [10 * (k + 1) for k in range(11)]
        http.close()


def test_an_event_without_its_series_past_a_long_gap(sqlite_url, new_run, records):
    """More new intervals than an event carries: the event names the state alone (the page asks)."""
    from packscope.backend.routes.reads import EVENT_SERIES_INTERVALS

    with serving(Settings(database_url=sqlite_url, **NO_POLL)) as url:
        assert httpx.post(f"{url}/api/v1/runs", json=new_run()).status_code == 201
        httpx.post(f"{url}/api/v1/runs/run-1/intervals", json={"intervals": records(1)})
        got: queue.Queue[dict] = queue.Queue()
        opened = threading.Event()
        threading.Thread(target=read_events, args=(url, "run-1", got, opened), daemon=True).start()
        assert opened.wait(10)
        got.get(timeout=10)
        batch = {"intervals": records(EVENT_SERIES_INTERVALS + 1, start=1)}
        assert httpx.post(f"{url}/api/v1/runs/run-1/intervals", json=batch).status_code == 200
        assert got.get(timeout=10) == {"run_id": "run-1", "interval": EVENT_SERIES_INTERVALS + 1, "last_step": 660}


def test_an_events_series_is_read_once_for_all_the_streams_of_a_server(sqlite_url, new_run, records, monkeypatch):
    """A run page open in many browsers: the event's series is read once per event in a server
    process, not once per stream."""
    from packscope.backend.reads import series as series_module

    read = series_module.series
    calls: list[tuple[int | None, int | None]] = []

    def counted(session, run, max_points, step_min=None, step_max=None):
        calls.append((step_min, step_max))
        return read(session, run, max_points, step_min, step_max)

    monkeypatch.setattr(series_module, "series", counted)
    streams = 40
    with serving(Settings(database_url=sqlite_url, **NO_POLL)) as url:
        assert httpx.post(f"{url}/api/v1/runs", json=new_run()).status_code == 201
        httpx.post(f"{url}/api/v1/runs/run-1/intervals", json={"intervals": records(1)})
        queues: list[queue.Queue[dict]] = []
        for _ in range(streams):
            got: queue.Queue[dict] = queue.Queue()
            opened = threading.Event()
            threading.Thread(target=read_events, args=(url, "run-1", got, opened), daemon=True).start()
            assert opened.wait(10)
            got.get(timeout=10)
            queues.append(got)
        for start in (1, 2):
            assert (
                httpx.post(
                    f"{url}/api/v1/runs/run-1/intervals", json={"intervals": records(1, start=start)}
                ).status_code
                == 200
            )
            events = [q.get(timeout=20) for q in queues]
            assert all(e == events[0] for e in events) and events[0]["series"]["points"] == 1
        assert calls == [(11, 20), (21, 30)]


def test_stream_keeps_the_connection_alive(server, new_run):
    http = httpx.Client(base_url=server, timeout=5)
    http.post("/api/v1/runs", json=new_run())
    with http.stream("GET", "/api/v1/runs/run-1/stream") as response:
        first = next(line for line in response.iter_lines() if line)
    assert first.startswith(":")  # no intervals yet: only keep-alive comments
    http.close()


# -- push, not poll ---------------------------------------------------------------------------------
# Polls and keep-alives far longer than the test: an event that arrives came by push.
NO_POLL = {"stream_poll_s": 60.0, "stream_keepalive_s": 60.0, "ingest_token": None, "read_token": None}


def events_of(url: str, run_id: str, into: "queue.Queue[tuple[float, dict]]", opened: threading.Event) -> None:
    """Put (arrival time, event) of the run's stream into `into` until the server stops."""
    read_events(url, run_id, into, opened, stamped=True)


@pytest.mark.parametrize("servers", [1, 2])
def test_a_new_interval_is_pushed_to_open_streams_of_every_server(database_url, new_run, records, servers):
    # The issue: live was bounded by a 1 s poll. Here a poll would take 60 s; two servers over one
    # database stand for two worker processes (or two machines on PostgreSQL).
    with (
        serving(Settings(database_url=database_url, **NO_POLL)) as writer,
        contextlib_servers(database_url, servers - 1) as others,
    ):
        reader = (others or [writer])[0]
        assert httpx.post(f"{writer}/api/v1/runs", json=new_run()).status_code == 201
        assert httpx.post(f"{writer}/api/v1/runs/run-1/intervals", json={"intervals": records(1)}).status_code == 200
        got: queue.Queue[tuple[float, dict]] = queue.Queue()
        opened = threading.Event()
        threading.Thread(target=events_of, args=(reader, "run-1", got, opened), daemon=True).start()
        assert opened.wait(10)
        assert got.get(timeout=10)[1]["interval"] == 0  # the state when the stream opened
        for start in (1, 3):
            posted = time.monotonic()
            batch = {"intervals": records(2, start=start)}
            assert httpx.post(f"{writer}/api/v1/runs/run-1/intervals", json=batch).status_code == 200
            arrived, event = got.get(timeout=10)
            assert event["interval"] == start + 1
            assert arrived - posted < 5  # pushed: a poll or keep-alive would take 60 s
        # A batch of duplicates changes nothing and wakes nobody.
        assert httpx.post(f"{writer}/api/v1/runs/run-1/intervals", json=batch).json()["accepted"] == 0
        with pytest.raises(queue.Empty):
            got.get(timeout=0.5)


class contextlib_servers:
    """`count` more servers over one database, as a context manager of their URLs."""

    def __init__(self, database_url: str, count: int) -> None:
        self.contexts = [serving(Settings(database_url=database_url, **NO_POLL)) for _ in range(count)]

    def __enter__(self) -> list[str]:
        return [context.__enter__() for context in self.contexts]

    def __exit__(self, *exc: object) -> None:
        for context in reversed(self.contexts):
            context.__exit__(*exc)


def test_a_deleted_run_ends_its_streams(database_url, new_run, records):
    with serving(Settings(database_url=database_url, **NO_POLL)) as url:
        httpx.post(f"{url}/api/v1/runs", json=new_run())
        done = threading.Event()

        def read_to_end() -> None:
            with httpx.stream("GET", f"{url}/api/v1/runs/run-1/stream", timeout=30) as answer:
                for _ in answer.iter_lines():
                    pass
            done.set()

        threading.Thread(target=read_to_end, daemon=True).start()
        time.sleep(0.3)
        assert httpx.delete(f"{url}/api/v1/runs/run-1").status_code == 204
        assert done.wait(10), "the stream of a deleted run stayed open"


def test_the_socket_of_a_process_that_died_is_removed(tmp_path: Path):
    folder = tmp_path / "db.live"
    folder.mkdir(mode=0o700)
    dead = folder / "999999-dead.sock"
    orphan = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    orphan.bind(str(dead))
    orphan.close()  # as after kill -9: the file stays, nobody reads it

    async def publish_once() -> list[str]:
        woken: list[str] = []
        alive_hub, publisher_hub = LiveHub(UnixDatagrams(folder)), LiveHub(UnixDatagrams(folder))
        await alive_hub.start()
        await publisher_hub.start()
        with alive_hub.subscribe("run-1") as event:
            publisher_hub.publish("run-1")
            await asyncio.wait_for(event.wait(), 5)
            woken.append("run-1")
        await alive_hub.stop()
        await publisher_hub.stop()
        return woken

    assert asyncio.run(publish_once()) == ["run-1"]
    assert not dead.exists()
    assert not folder.exists()  # both hubs removed their own socket on stop, the last one the folder


def test_the_socket_folder_goes_with_the_last_process_only(tmp_path: Path):
    folder = tmp_path / "db.live"

    async def two_then_none() -> list[bool]:
        first, second = LiveHub(UnixDatagrams(folder)), LiveHub(UnixDatagrams(folder))
        await first.start()
        await second.start()
        await first.stop()
        kept = folder.exists() and len(list(folder.glob("*.sock"))) == 1  # the second still listens there
        await second.stop()
        third = LiveHub(UnixDatagrams(folder))  # a process started after: made again
        await third.start()
        remade = third.pushes and folder.exists()
        await third.stop()
        return [kept, remade, folder.exists()]

    assert asyncio.run(two_then_none()) == [True, True, False]


def test_each_database_gets_its_transport(tmp_path):
    with tempfile.TemporaryDirectory(dir="/tmp") as short:
        transport = transport_for(make_engine(f"sqlite:///{short}/packscope.db"))
        assert isinstance(transport, UnixDatagrams) and transport.pushes
        assert transport.folder == Path(f"{short}/packscope.db.live")  # beside the database
    deep = tmp_path / ("d" * 90)
    deep.mkdir()
    far = transport_for(make_engine(f"sqlite:///{deep / 'packscope.db'}"))
    assert isinstance(far, UnixDatagrams) and len(str(far.folder)) < 90  # a socket path fits
    assert not InProcess.pushes


def test_a_socket_folder_that_cannot_be_made_means_polling_not_a_failed_start(tmp_path, caplog):
    blocker = tmp_path / "db.live"
    blocker.write_text("a file where the folder would be")

    async def start_and_stop() -> bool:
        hub = LiveHub(UnixDatagrams(blocker))
        await hub.start()
        hub.publish("run-1")  # still wakes this process's streams
        await asyncio.sleep(0)
        pushes = hub.pushes
        await hub.stop()
        return pushes

    assert asyncio.run(start_and_stop()) is False
    assert "live pages poll" in caplog.text


def test_a_stream_opened_after_others_closed_is_still_pushed_to(database_url, new_run, records):
    """On PostgreSQL a server LISTENs only while it has a stream open (live.PostgresNotify): the
    second stream, opened after the first closed, must still be woken by push."""
    with serving(Settings(database_url=database_url, **NO_POLL)) as url:
        assert httpx.post(f"{url}/api/v1/runs", json=new_run()).status_code == 201
        assert httpx.post(f"{url}/api/v1/runs/run-1/intervals", json={"intervals": records(1)}).status_code == 200
        for start in (1, 3):  # each round one stream, closed before the next opens
            with httpx.stream("GET", f"{url}/api/v1/runs/run-1/stream", timeout=10) as answer:
                lines = answer.iter_lines()
                opened = next(line for line in lines if line.startswith("event:"))
                assert opened == "event: interval"  # the state when the stream opened
                next(lines)
                posted = time.monotonic()
                batch = {"intervals": records(2, start=start)}
                assert httpx.post(f"{url}/api/v1/runs/run-1/intervals", json=batch).status_code == 200
                assert next(line for line in lines if line.startswith("data:"))  # pushed, not polled (60 s)
                assert time.monotonic() - posted < 5
            time.sleep(1.5)  # the server notices the stream is gone and stops listening
