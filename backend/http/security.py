"""Protections of every answer and every write: security headers; writes only as JSON and only
from this server's own pages (never another site's, through the visitor's browser); token
guesses throttled per client, at the sign-in form and on the API; a sign-in form that cannot make
the server parse a huge body.

The client address is the TCP peer's (`scope["client"]`): uvicorn replaces it by X-Forwarded-For
only for the proxies named in PACKSCOPE_TRUSTED_PROXIES (backend/server/serving.py).
"""

import hashlib
import hmac
import json
import math
import time
from collections import OrderedDict, deque
from collections.abc import Iterable
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.requests import cookie_parser
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

# Scripts, styles and fetches come from this server only (plotly.js is served from
# /vendor/plotly.min.js, never a CDN). Plotly sets inline styles on the charts it draws, so
# styles also allow 'unsafe-inline'; data:/blob: images are plotly's icons and PNG downloads.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; font-src 'self' data:; object-src 'none'; "
    "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
)
HEADERS = [
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
]
# FastAPI's /docs and /redoc pages load Swagger UI and ReDoc from a CDN with inline scripts.
CSP_EXEMPT = ("/docs", "/redoc")
_WITH_CSP = [*HEADERS, (b"content-security-policy", CONTENT_SECURITY_POLICY.encode())]

# Browsers cannot put a bearer header on EventSource or plain page loads: the dashboard's
# sign-in page stores a value derived from the read token in this HttpOnly cookie instead.
READ_COOKIE = "packscope_read"
SIGN_IN_PATH = "/sign-in"
SIGN_IN_MAX_BYTES = 8 * 1024  # a token and a return path
WINDOW_S = 60.0
MAX_TRACKED_CLIENTS = 10_000


def read_cookie_value(read_token: str) -> str:
    """What the sign-in cookie holds: derived from the token by HMAC, so the cookie jar (or a
    leaked cookie) never reveals the token itself, and a new token invalidates old cookies."""
    return hmac.new(read_token.encode(), b"packscope read session v1", hashlib.sha256).hexdigest()


class SecurityHeaders:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        extra = HEADERS if scope["path"].startswith(CSP_EXEMPT) else _WITH_CSP

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = list(message.get("headers", ()))
                present = {name.lower() for name, _ in headers}
                message["headers"] = [*headers, *(h for h in extra if h[0] not in present)]
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _answer(send: Send, code: int, detail: str, retry_after_s: int | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def first_headers(scope: Scope, names: frozenset[bytes]) -> dict[bytes, str]:
    """The first value of each of `names` (lower case) the request sends, as Starlette's
    Headers.get reads it, in one pass over the raw headers and without copying them (a guard
    that needs only these asks for them per request)."""
    headers = scope["headers"]
    if not isinstance(headers, list):  # any iterable, in ASGI: read once (Starlette's Headers does the same)
        headers = scope["headers"] = list(headers)
    found: dict[bytes, str] = {}
    for name, value in headers:
        if name in names and name not in found:
            found[name] = value.decode("latin-1")
    return found


def client_of(scope: Scope) -> str:
    """The client's address: the TCP peer, or what a trusted proxy said it was."""
    return scope["client"][0] if scope.get("client") else "unknown"


class RecentAttempts:
    """Attempts per client address within the last WINDOW_S seconds (per worker process: with N
    workers a client gets at most N times as many)."""

    def __init__(self, per_minute: int) -> None:
        self.per_minute = per_minute
        self.attempts: dict[str, deque[float]] = {}

    def _recent(self, client: str, now: float) -> deque[float]:
        if len(self.attempts) > MAX_TRACKED_CLIENTS:  # forget clients whose window has passed
            self.attempts = {c: a for c, a in self.attempts.items() if a and now - a[-1] < WINDOW_S}
        recent = self.attempts.setdefault(client, deque())
        while recent and now - recent[0] >= WINDOW_S:
            recent.popleft()
        return recent

    def retry_after(self, client: str) -> int | None:
        """Seconds until `client` may try again, or None when it may now."""
        if not self.attempts.get(client):  # none in the window (per_minute >= 1): nothing to forget
            return None
        now = time.monotonic()
        recent = self._recent(client, now)
        if len(recent) >= self.per_minute:
            return max(1, math.ceil(WINDOW_S - (now - recent[0])))
        return None

    def add(self, client: str) -> None:
        now = time.monotonic()
        self._recent(client, now).append(now)


class SignInGuard:
    """POST /sign-in: at most `per_minute` attempts per client address (429 with Retry-After
    beyond), and a body of at most SIGN_IN_MAX_BYTES (413), both checked before the form is parsed."""

    def __init__(self, app: ASGIApp, per_minute: int) -> None:
        self.app = app
        self.attempts = RecentAttempts(per_minute)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != SIGN_IN_PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        client = client_of(scope)
        wait = self.attempts.retry_after(client)
        if wait is None:
            self.attempts.add(client)
        else:
            await _answer(send, 429, f"too many sign-in attempts from {client}; retry after {wait} s", wait)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > SIGN_IN_MAX_BYTES):
            await _answer(send, 413, f"a sign-in form is at most {SIGN_IN_MAX_BYTES} bytes")
            return
        received = 0
        refused = False

        async def capped_receive() -> Message:
            # Past the cap: answer 413 here and tell the app the client left, so it stops reading.
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            received += len(message.get("body", b""))
            if received > SIGN_IN_MAX_BYTES:
                refused = True
                await _answer(send, 413, f"a sign-in form is at most {SIGN_IN_MAX_BYTES} bytes")
                return {"type": "http.disconnect"}
            return message

        async def send_unless_refused(message: Message) -> None:
            if not refused:
                await send(message)

        await self.app(scope, capped_receive, send_unless_refused)


_CREDENTIAL_HEADERS = frozenset({b"authorization", b"cookie"})


def _presents_a_credential(scope: Scope) -> bool:
    found = first_headers(scope, _CREDENTIAL_HEADERS)
    return b"authorization" in found or f"{READ_COOKIE}=" in found.get(b"cookie", "")


class TokenGuard:
    """The API's bearer tokens cannot be guessed quickly: a client whose credentials (a bearer
    header or the sign-in cookie) were refused `per_minute` times within a minute is answered 429
    with Retry-After on every API request until the oldest refusal is a minute old. A request
    without any credential is no guess and is not counted.

    Except a credential that this client address presented right before it was locked out (an
    agent or a signed-in page behind the same address as the guesser, a NAT): that one keeps
    working. A guess is never compared during the lock-out unless the address proved that very
    token earlier, so a guesser alone at an address still cannot tell when it found the token."""

    def __init__(
        self, app: ASGIApp, per_minute: int, bearer_tokens: Iterable[str | None] = (), read_cookie: str | None = None
    ) -> None:
        self.app = app
        self.refusals = RecentAttempts(per_minute)
        self.bearer_tokens = [token for token in bearer_tokens if token is not None]
        self.read_cookie = read_cookie
        # The right credentials each address presented while not locked out (most recent last).
        self.proven: OrderedDict[str, set[str]] = OrderedDict()

    def _right_credential(self, headers: Headers) -> str | None:
        """The configured credential the request presents (its value), or None."""
        scheme, _, given = headers.get("authorization", "").partition(" ")
        if scheme.lower() == "bearer" and given:
            for token in self.bearer_tokens:
                if hmac.compare_digest(given.encode(), token.encode()):
                    return token
        if self.read_cookie is not None and READ_COOKIE in headers.get("cookie", ""):
            cookie = cookie_parser(headers["cookie"]).get(READ_COOKIE, "")
            if hmac.compare_digest(cookie.encode(), self.read_cookie.encode()):
                return self.read_cookie
        return None

    def _prove(self, client: str, credential: str) -> None:
        self.proven.setdefault(client, set()).add(credential)
        self.proven.move_to_end(client)
        if len(self.proven) > MAX_TRACKED_CLIENTS:
            self.proven.popitem(last=False)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/api/"):
            await self.app(scope, receive, send)
            return
        client = client_of(scope)
        wait = self.refusals.retry_after(client)
        if wait is not None:
            right = self._right_credential(Headers(scope=scope)) if client in self.proven else None
            if right is None or right not in self.proven[client]:
                await _answer(send, 429, f"too many refused tokens from {client}; retry after {wait} s", wait)
                return
        elif not _presents_a_credential(scope):
            await self.app(scope, receive, send)
            return
        elif (right := self._right_credential(Headers(scope=scope))) is not None:
            self._prove(client, right)

        async def count_refusals(message: Message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 401:
                self.refusals.add(client)
            await send(message)

        await self.app(scope, receive, count_refusals)


UNSAFE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})
BODY_METHODS = frozenset({"POST", "PATCH"})  # those the API serves with a body (PUT: 405, DELETE: none)
JSON_MEDIA_TYPE = "application/json"


def _origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def cross_origin_refusal(headers: Headers, allowed: frozenset[str]) -> str | None:
    """Why a write comes from another site through a visitor's browser, or None.

    Browsers say where a request comes from (Sec-Fetch-Site, Origin); the agent, curl and scripts
    send neither and are judged by their token alone. Same-site is refused too: a sibling
    subdomain is another application.
    """
    origin = headers.get("origin")
    if origin is not None and origin.rstrip("/").lower() in allowed:
        return None
    site = headers.get("sec-fetch-site")
    if site is not None:
        # What the browser itself says, and the one to believe: under this server's
        # `Referrer-Policy: no-referrer` a same-origin form post says `Origin: null`.
        return None if site in ("same-origin", "none") else f"a write from another site (Sec-Fetch-Site: {site})"
    if origin is None:
        return None
    host = headers.get("host", "").lower()
    if origin == "null" or urlsplit(_origin_of(origin)).netloc != host:
        return f"a write from another origin ({origin}, this server is {host or 'unnamed'})"
    return None


def _routed(scope: Scope) -> bool:
    """Whether a route of the application serves the request's method at its path: one that none
    serves is left to the router's 405 (or 404), not refused for its Content-Type."""
    return any(route.matches(scope)[0] == Match.FULL for route in scope["app"].router.routes)


_WRITE_HEADERS = frozenset({b"origin", b"sec-fetch-site", b"content-type"})


class WriteGuard:
    """Writes (POST, PUT, PATCH, DELETE) from another origin are refused (403), and writes to the
    API must be JSON (415): a page on any site can make a browser send a `text/plain` or form POST
    without asking the server first (no CORS preflight), never an `application/json` one."""

    def __init__(self, app: ASGIApp, allowed_origins: frozenset[str]) -> None:
        self.app = app
        self.allowed_origins = allowed_origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] not in UNSAFE_METHODS:
            await self.app(scope, receive, send)
            return
        found = first_headers(scope, _WRITE_HEADERS)
        # Neither header: a client that is no browser (the agent), never refused for its origin.
        both_absent = b"origin" not in found and b"sec-fetch-site" not in found
        refusal = None if both_absent else cross_origin_refusal(Headers(scope=scope), self.allowed_origins)
        if refusal is not None:
            await _answer(
                send,
                403,
                f"{refusal} is refused: packscope takes writes from its own pages and from clients that "
                "send no Origin (the agent); name other origins in PACKSCOPE_ALLOWED_ORIGINS",
            )
            return
        if scope["path"].startswith("/api/") and scope["method"] in BODY_METHODS:
            media_type = found.get(b"content-type", "").split(";")[0].strip().lower()
            if media_type != JSON_MEDIA_TYPE and _routed(scope):
                shown = media_type or "none"
                await _answer(
                    send,
                    415,
                    f"Content-Type {shown} is not accepted: send the body as JSON with "
                    "'Content-Type: application/json' (gzip it with 'Content-Encoding: gzip' if you like)",
                )
                return
        await self.app(scope, receive, send)
