"""The one HTTP client of packscope's senders: the agent's sender thread, `packscope import` and
`packscope sync` all talk to a server through it, with one policy for waiting between tries.

Standard library only: the agent imports it inside a trainer (torch, the standard library and
packscope.core, nothing else), the importer with the bare package.

    client = HttpClient("http://127.0.0.1:8000", token=None)
    status, answer = client.request("POST", "/api/v1/runs", {"run_id": ...})

A request that does not succeed raises `HttpError`, which holds what a caller decides on: the
status (None when no answer came), the server's detail, its Retry-After in seconds, and whether
nothing listened at all. How long to wait before the next try is `Backoff.delay`: our own
exponential backoff, which a server's Retry-After can lengthen but never shorten (a server that
answers `Retry-After: 0` to every request still gets backoff, not a flood).
"""

from __future__ import annotations

import gzip
import http.client
import json
import urllib.error
import urllib.request
from dataclasses import dataclass
from typing import Any

from packscope.core.retry_after import retry_after_s

GZIP_LEVEL = 1  # on 64 interval records: 3.5x smaller at level 1, 4.1x at 6 for 1.8x the time
# A longer Retry-After is taken as this: long enough for a server shedding a burst, short enough
# that a wrong date (clock skew) does not silence a sender, or stall `packscope import`, for hours.
RETRY_AFTER_CAP_S = 300.0


@dataclass(frozen=True)
class Backoff:
    """The wait after `failures` failed tries in a row: base_s, doubling per failure up to max_s;
    a server's Retry-After (capped at RETRY_AFTER_CAP_S) replaces it only when it is longer."""

    base_s: float = 2.0
    max_s: float = 60.0

    def __post_init__(self) -> None:
        if not 0 < self.base_s <= self.max_s:
            raise ValueError(f"backoff needs 0 < base_s <= max_s, got {self.base_s} and {self.max_s}")

    def delay(self, failures: int, retry_after: float | None = None) -> float:
        own = min(self.max_s, self.base_s * 2 ** min(max(failures, 1) - 1, 30))
        if retry_after is None:
            return own
        return max(own, min(retry_after, RETRY_AFTER_CAP_S))


class HttpError(Exception):
    """A request that did not succeed: no answer (`status` None), a status other than 2xx, or a
    2xx whose body is not JSON (`invalid_answer`)."""

    def __init__(
        self,
        method: str,
        path: str,
        server: str,
        status: int | None,
        detail: Any,
        retry_after: float | None = None,
        invalid_answer: bool = False,
    ) -> None:
        self.method, self.path, self.server = method, path, server
        self.status, self.detail, self.retry_after = status, detail, retry_after
        self.invalid_answer = invalid_answer
        what = f"HTTP {status}: {short(detail)}" if status is not None else str(detail)
        super().__init__(f"{method} {path}: {what}")

    @property
    def nothing_listens(self) -> bool:
        """The connection was refused: no server at that address (as opposed to a dropped one)."""
        return isinstance(self.detail, ConnectionRefusedError)


class HttpClient:
    """JSON requests to one server, gzip-compressed, with an optional bearer token."""

    def __init__(self, server: str, token: str | None = None, timeout_s: float = 60.0) -> None:
        self.server = server.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def request(self, method: str, path: str, body: Any, timeout_s: float | None = None) -> tuple[int, Any]:
        """(status, parsed JSON answer) of a 2xx answer, else HttpError. `body` is sent as JSON;
        bytes are taken as JSON already encoded (the sender joins spooled records unparsed)."""
        data = body if isinstance(body, bytes) else json.dumps(body, default=str).encode()
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip", "Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            req = urllib.request.Request(
                self.server + path, data=gzip.compress(data, GZIP_LEVEL), headers=headers, method=method
            )
            with urllib.request.urlopen(req, timeout=self.timeout_s if timeout_s is None else timeout_s) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as err:
            try:
                raw_error = err.read()
            except (OSError, http.client.HTTPException):  # the connection broke while reading the error
                raw_error = b""
            detail = _detail(raw_error, err.reason)
            raise HttpError(method, path, self.server, err.code, detail, retry_after_s(err.headers)) from None
        except urllib.error.URLError as err:  # an OSError too, but its reason says more
            raise HttpError(method, path, self.server, None, err.reason) from None
        except (OSError, http.client.HTTPException, ValueError) as err:  # ValueError: a malformed URL
            raise HttpError(method, path, self.server, None, err) from None
        try:
            return status, json.loads(raw or b"null")
        except ValueError:
            raise HttpError(
                method, path, self.server, status, f"the answer is not JSON: {raw[:200]!r}", invalid_answer=True
            ) from None


def _detail(raw: bytes, reason: object) -> Any:
    """The server's `detail` (FastAPI's error body), else its text."""
    try:
        body = json.loads(raw)
    except ValueError:
        return raw[:500].decode(errors="replace") or str(reason)
    return body.get("detail", body) if isinstance(body, dict) else body


def short(detail: Any) -> str:
    text = detail if isinstance(detail, str) else json.dumps(detail, default=str)
    return text if len(text) <= 500 else text[:500] + "..."
