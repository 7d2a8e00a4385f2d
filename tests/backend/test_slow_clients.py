"""No slow client stops the server: request heads and bodies have deadlines that arriving bytes do
not extend (slowloris), heads have a size cap, and CSV readers that do not read hold no database
slot. Against a real uvicorn server with `packscope serve`'s options."""

import contextlib
import socket
import time
from collections.abc import Callable

import httpx
import pytest
from fastapi import HTTPException

from packscope.backend.http.settings import Settings
from tests.backend.conftest import run_body
from tests.backend.uvicorn_server import serving


def settings(sqlite_url: str, **changes) -> Settings:
    return Settings(database_url=sqlite_url, ingest_token=None, read_token=None, **changes)


def connect(url: str) -> socket.socket:
    host, port = url.removeprefix("http://").split(":")
    return socket.create_connection((host, int(port)), timeout=5)


def closed_by_server(sock: socket.socket) -> bytes | None:
    """What the server sent before closing, or None while the connection is still open."""
    sock.setblocking(False)
    received = b""
    try:
        while chunk := sock.recv(4096):
            received += chunk
    except BlockingIOError:
        return None
    except ConnectionResetError:
        pass
    return received


def test_request_heads_sent_a_byte_at_a_time_are_cut_off_and_the_server_keeps_answering(sqlite_url):
    # The slowloris: 19,850 unfinished heads held open for 60 s; here 40 of them.
    with serving(settings(sqlite_url, request_head_timeout_s=0.6)) as url:
        socks = [connect(url) for _ in range(40)]
        for sock in socks:
            sock.sendall(b"GET /api/v1/runs HTTP/1.1\r\nHost: x\r\n")
        started = time.monotonic()
        answers: dict[int, bytes] = {}
        while len(answers) < len(socks) and time.monotonic() - started < 5:
            for i, sock in enumerate(socks):
                if i in answers:
                    continue
                with contextlib.suppress(OSError):
                    sock.sendall(b"X")  # one more byte of a header that never ends
                got = closed_by_server(sock)
                if got is not None:
                    answers[i] = got
            assert httpx.get(f"{url}/api/v1/runs", timeout=2).status_code == 200
            time.sleep(0.1)
        elapsed = time.monotonic() - started
        for sock in socks:
            sock.close()
    assert len(answers) == len(socks), f"{len(socks) - len(answers)} unfinished heads still open after {elapsed:.1f} s"
    assert all(a.startswith(b"HTTP/1.1 408") or a == b"" for a in answers.values())


def test_a_kept_alive_connection_gets_a_new_head_deadline_from_each_answer(sqlite_url):
    # One timer per connection fires at the first deadline and finds it moved on by the answers
    # since: the connection lives on while it asks in time, and is cut off once it stalls.
    with serving(settings(sqlite_url, request_head_timeout_s=0.6, keep_alive_s=30)) as url:
        sock = connect(url)
        started = time.monotonic()
        while time.monotonic() - started < 2.0:  # past three head deadlines, none of them missed
            sock.sendall(b"GET /api/v1/catalogue HTTP/1.1\r\nHost: x\r\n\r\n")
            answer = b""
            while b"\r\n\r\n" not in answer:
                answer += sock.recv(65536)
            assert answer.startswith(b"HTTP/1.1 200"), answer[:100]
            length = int(answer.split(b"content-length: ")[1].split(b"\r\n")[0])
            body_start = answer.index(b"\r\n\r\n") + 4
            while len(answer) - body_start < length:
                answer += sock.recv(65536)
            answered = time.monotonic()  # the next head's deadline runs from the answer
            time.sleep(0.35)
        sock.sendall(b"GET /api/v1/catalogue HTTP/1.1\r\nHost: x\r\n")  # a head that stalls
        while (got := closed_by_server(sock)) is None:
            assert time.monotonic() - answered < 3, "a stalled head on a kept-alive connection waits for ever"
            time.sleep(0.02)
        sock.close()
    assert time.monotonic() - answered >= 0.55  # not before its own deadline
    assert got.startswith(b"HTTP/1.1 408") or got == b""


def test_a_body_that_never_arrives_is_cut_off(sqlite_url):
    with serving(settings(sqlite_url, request_body_timeout_s=0.5)) as url:
        assert httpx.post(f"{url}/api/v1/runs", json=run_body()).status_code == 201
        sock = connect(url)
        sock.sendall(
            b"POST /api/v1/runs/run-1/intervals HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"intervals": ['
        )
        deadline = time.monotonic() + 5
        while closed_by_server(sock) is None:
            assert time.monotonic() < deadline, "a body that stopped half-way is waited for without end"
            time.sleep(0.05)
        sock.close()
        assert httpx.get(f"{url}/api/v1/runs/run-1", timeout=2).json()["records"] == 0


def test_a_request_head_past_64_kib_is_refused(sqlite_url):
    with serving(settings(sqlite_url)) as url:
        sock = connect(url)
        sock.sendall(b"GET /api/v1/runs HTTP/1.1\r\nHost: x\r\n")
        try:
            for _ in range(80):
                sock.sendall(b"X-Filler: " + b"y" * 1000 + b"\r\n")
        except OSError:
            pass  # the server closed while we were still sending
        sock.settimeout(5)
        try:
            got = sock.recv(4096)
        except ConnectionResetError:
            got = b""
        sock.close()
        assert got.startswith(b"HTTP/1.1 431") or got == b""
        assert httpx.get(f"{url}/api/v1/runs", timeout=2).status_code == 200


@pytest.mark.parametrize("kept_alive_s", [1])
def test_idle_kept_alive_connections_are_closed(sqlite_url, kept_alive_s):
    with serving(settings(sqlite_url, keep_alive_s=kept_alive_s)) as url:
        sock = connect(url)
        sock.sendall(b"GET /api/v1/catalogue HTTP/1.1\r\nHost: x\r\n\r\n")
        time.sleep(0.3)
        assert (answer := closed_by_server(sock)) is None or answer.startswith(b"HTTP/1.1 200")
        deadline = time.monotonic() + kept_alive_s + 3
        while closed_by_server(sock) is None:
            assert time.monotonic() < deadline, "an idle kept-alive connection stays open"
            time.sleep(0.1)
        sock.close()


# -- CSV readers that do not read ---------------------------------------------------------------------
def request_and_never_read(url: str, path: str) -> socket.socket:
    """A client that asks for `path` and then reads nothing, with a small receive window."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    return sock


@pytest.fixture
def long_csv_server(sqlite_url, records):
    """A server with 2 database slots (4 pooled connections) and a run whose CSV is far larger than
    what socket buffers hold (about 1 KB a row)."""
    limits = {"db_slots": 2, "pool_wait_s": 0.5, "queue_wait_s": 0.5, "csv_streams": 20, "csv_streams_per_client": 20}
    with serving(settings(sqlite_url, **limits)) as url:
        http = httpx.Client(base_url=url, timeout=30)
        assert http.post("/api/v1/runs", json=run_body()).status_code == 201
        for start in range(0, 16000, 1000):
            assert (
                http.post("/api/v1/runs/run-1/intervals", json={"intervals": records(1000, start=start)}).status_code
                == 200
            )
        yield url, http
        http.close()


def within(seconds: float, call: Callable[[], httpx.Response]) -> httpx.Response:
    """`call`'s answer, asked again after each 503's Retry-After until `seconds` pass: on a loaded
    machine the eight exports may still be writing their files (each holds a database slot while
    it does) when the test first asks; exports that held a slot while their reader is stuck would
    shed every request, however long the test waits."""
    deadline = time.monotonic() + seconds
    while (answer := call()).status_code == 503 and time.monotonic() < deadline:
        time.sleep(float(answer.headers.get("Retry-After", "1")))
    return answer


def test_csv_readers_that_never_read_leave_ingest_and_the_runs_list_answering(long_csv_server, records):
    # The issue: 40 clients that request a CSV and never read it made the runs list and ingest
    # answer 503; here 8 of them against 4 pooled connections.
    url, http = long_csv_server
    size = len(http.get("/api/v1/runs/run-1/intervals.csv").content)
    assert size > 6_000_000, size  # more than the server's and client's socket buffers together
    readers = [request_and_never_read(url, "/api/v1/runs/run-1/intervals.csv") for _ in range(8)]
    time.sleep(1.5)  # each export has reached the point where its client stops it
    try:
        for k in range(3):
            assert within(30, lambda: http.get("/api/v1/runs")).status_code == 200
            batch = {"intervals": records(1, start=20000 + k)}
            answer = within(30, lambda: http.post("/api/v1/runs/run-1/intervals", json=batch))  # noqa: B023
            assert answer.status_code == 200, answer.text
            time.sleep(0.2)
    finally:
        for sock in readers:
            sock.close()
    time.sleep(0.5)
    assert http.get("/api/v1/runs").status_code == 200
    assert http.post("/api/v1/runs/run-1/intervals", json={"intervals": records(1, start=20100)}).status_code == 200


def test_csv_exports_are_capped_per_client_and_in_all(make_client, run, records):
    client = make_client(csv_streams=3, csv_streams_per_client=2)
    client.post("/api/v1/runs", json=run_body())
    limits = client.app.state.csv_limits
    first, second = limits.claim("10.0.0.1"), limits.claim("10.0.0.1")
    third = client.get("/api/v1/runs/run-1/intervals.csv")  # another client ("testclient"): in the total
    assert third.status_code == 200
    with pytest.raises(HTTPException) as per_client:
        limits.claim("10.0.0.1")
    assert per_client.value.status_code == 429 and "PACKSCOPE_CSV_STREAMS_PER_CLIENT" in per_client.value.detail
    other = limits.claim("10.0.0.2")
    with pytest.raises(HTTPException) as in_all:
        limits.claim("10.0.0.3")
    assert in_all.value.status_code == 503 and in_all.value.headers["Retry-After"] == "1"
    answer = client.get("/api/v1/runs/run-1/intervals.csv")
    assert answer.status_code == 503 and "PACKSCOPE_CSV_STREAMS" in answer.json()["detail"]
    for release in (first, second, other):
        release()
        release()  # ending twice counts once
    assert limits.streaming == {}
    assert client.get("/api/v1/runs/run-1/intervals.csv").status_code == 200


def send_whole_body_then_read(url: str, path: str, body: bytes, chunked: bool) -> bytes:
    """A client as curl or the agent's: the whole body sent, then the answer read."""
    head = f"POST {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    head += "Transfer-Encoding: chunked\r\n\r\n" if chunked else f"Content-Length: {len(body)}\r\n\r\n"
    if chunked:
        step = 256 * 1024
        body = b"".join(
            b"%x\r\n%s\r\n" % (len(body[i : i + step]), body[i : i + step]) for i in range(0, len(body), step)
        )
        body += b"0\r\n\r\n"
    with connect(url) as sock:
        sock.settimeout(30)
        sock.sendall(head.encode() + body)
        answer = b""
        while chunk := sock.recv(65536):
            answer += chunk
    return answer


@pytest.mark.parametrize("chunked", [False, True])
@pytest.mark.parametrize("path", ["/api/v1/runs/run-1/intervals", "/api/v1/runs"])
def test_a_body_over_the_limit_sent_whole_before_reading_gets_its_413(sqlite_url, path, chunked):
    """The server reads (and drops) the rest of a body over the limit before it answers 413 and
    closes, so a client that sends the whole body before reading gets the 413, not a reset."""
    with serving(settings(sqlite_url)) as url:  # the default limits: 8 MiB, 1 MiB for a run
        assert httpx.post(f"{url}/api/v1/runs", json=run_body()).status_code == 201
        answer = send_whole_body_then_read(url, path, b" " * 9_000_000, chunked)
        assert answer.startswith(b"HTTP/1.1 413 "), answer[:200]
        assert b"connection: close" in answer.lower() and b"PACKSCOPE_MAX" in answer
        assert httpx.get(f"{url}/api/v1/runs", timeout=2).status_code == 200
