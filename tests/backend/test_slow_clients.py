"""No slow client stops the server: request heads and bodies have deadlines that arriving bytes do
not extend (slowloris), heads have a size cap, and CSV readers that do not read hold no database
slot. Against a real uvicorn server with `packscope serve`'s options."""

import contextlib
import socket
import time

import httpx
import pytest

from packscope.backend.settings import Settings
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
