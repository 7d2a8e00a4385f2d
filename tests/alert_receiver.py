"""A local webhook receiver for the alert tests (pytest puts tests/ on the path): it keeps every
message it was sent, can answer 503 while `down` is set, or wait `delay_s` before answering, and
checks each message's signature when given the secret."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class Receiver:
    def __init__(self, secret: str | None = None) -> None:
        self.secret = secret
        self.messages: list[dict[str, Any]] = []  # {"headers", "body" (bytes), "json"}
        self.refused = 0
        self.down = False
        self.delay_s = 0.0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # the standard library's name
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if receiver.delay_s:
                    time.sleep(receiver.delay_s)
                if receiver.down:
                    with receiver._lock:
                        receiver.refused += 1
                    self.send_response(503)
                    self.end_headers()
                    return
                with receiver._lock:
                    receiver.messages.append({"headers": dict(self.headers), "body": body, "json": json.loads(body)})
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/hook"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def signed(self, message: dict[str, Any]) -> bool:
        assert self.secret is not None
        expected = "sha256=" + hmac.new(self.secret.encode(), message["body"], hashlib.sha256).hexdigest()
        return hmac.compare_digest(message["headers"].get("X-Packscope-Signature", ""), expected)

    def events(self) -> list[tuple[str, str, str]]:
        """(event, rule, subject) of each generic message, in arrival order."""
        with self._lock:
            return [
                (m["json"]["event"], m["json"]["alert"]["rule"], m["json"]["alert"]["subject"]) for m in self.messages
            ]

    def wait_for(self, count: int, timeout_s: float = 15.0) -> None:
        deadline = time.monotonic() + timeout_s
        while len(self.messages) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(self.messages)} messages after {timeout_s} s, expected {count}")
            time.sleep(0.02)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
