"""The one HTTP client of the sender, `packscope import` and `packscope sync`: its backoff, what a
failed request says, and that it needs nothing but the standard library."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from packscope.core.http_client import RETRY_AFTER_CAP_S, Backoff, HttpClient, HttpError
from packscope.core.ports import free_port


def test_the_backoff_doubles_to_its_cap_and_a_retry_after_only_lengthens_it():
    backoff = Backoff(2.0, 60.0)
    assert [backoff.delay(n) for n in range(1, 8)] == [2, 4, 8, 16, 32, 60, 60]
    assert backoff.delay(1, retry_after=0.0) == 2  # "no wait" still waits the backoff
    assert backoff.delay(3, retry_after=5.0) == 8
    assert backoff.delay(1, retry_after=30.0) == 30
    assert backoff.delay(1, retry_after=10**6) == RETRY_AFTER_CAP_S
    with pytest.raises(ValueError, match="0 < base_s <= max_s"):
        Backoff(0, 1)


class Answers(BaseHTTPRequestHandler):
    """Answers by path: /ok echoes the body it got, /busy 503 with Retry-After, /garbage a 200 that
    is not JSON, /missing 404 with FastAPI's error body."""

    def do_POST(self) -> None:
        raw = gzip.decompress(self.rfile.read(int(self.headers["Content-Length"])))
        if self.path == "/ok":
            self._send(200, json.dumps({"got": json.loads(raw), "auth": self.headers.get("Authorization")}).encode())
        elif self.path == "/busy":
            self._send(503, b'{"detail": "shedding load"}', {"Retry-After": "7"})
        elif self.path == "/garbage":
            self._send(200, b"<html>a proxy's page</html>")
        else:
            self._send(404, b'{"detail": "no such run"}')

    def _send(self, status: int, data: bytes, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        for key, value in (headers or {}).items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[str]:
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Answers)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()
    httpd.server_close()


def test_a_request_sends_gzipped_json_with_the_token(server):
    client = HttpClient(server, token="s3cret")
    assert client.server == server.rstrip("/")
    assert client.request("POST", "/ok", {"a": [1, 2]}) == (200, {"got": {"a": [1, 2]}, "auth": "Bearer s3cret"})
    assert client.request("POST", "/ok", b'{"joined":true}')[1]["got"] == {"joined": True}  # bytes: JSON as is


def test_failures_say_status_detail_and_retry_after(server):
    client = HttpClient(server)
    with pytest.raises(HttpError) as busy:
        client.request("POST", "/busy", {})
    assert (busy.value.status, busy.value.detail, busy.value.retry_after) == (503, "shedding load", 7.0)
    assert str(busy.value) == "POST /busy: HTTP 503: shedding load"
    with pytest.raises(HttpError) as missing:
        client.request("POST", "/missing", {})
    assert missing.value.status == 404 and not missing.value.invalid_answer
    with pytest.raises(HttpError) as garbage:
        client.request("POST", "/garbage", {})
    assert garbage.value.status == 200 and garbage.value.invalid_answer and "not JSON" in str(garbage.value)


def test_no_server_is_told_apart_from_a_dropped_connection():
    port = free_port()  # nothing listens on it
    with pytest.raises(HttpError) as refused:
        HttpClient(f"http://127.0.0.1:{port}").request("POST", "/x", {})
    assert refused.value.status is None and refused.value.nothing_listens
    with pytest.raises(HttpError) as malformed:
        HttpClient("not a url").request("POST", "/x", {})
    assert malformed.value.status is None and not malformed.value.nothing_listens


def test_it_imports_nothing_but_the_standard_library():
    code = (
        "import sys; before = set(sys.modules); import packscope.core.http_client; "
        "print('\\n'.join(sorted(set(sys.modules) - before)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    foreign = [m for m in out if m.split(".")[0] not in sys.stdlib_module_names and m.split(".")[0] != "packscope"]
    assert not foreign, foreign
    assert {m for m in out if m.startswith("packscope.")} <= {
        "packscope.core",
        "packscope.core.http_client",
        "packscope.core.retry_after",
    }
