"""Browser-facing protections: security headers on every answer, and a sign-in form that cannot
be used to guess the read token quickly or to make the server parse a huge body."""

import hashlib
import hmac
import math
import time
from collections import deque

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
        extra = list(HEADERS)
        if not scope["path"].startswith(CSP_EXEMPT):
            extra.append((b"content-security-policy", CONTENT_SECURITY_POLICY.encode()))

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                present = {name.lower() for name, _ in message.get("headers", [])}
                message["headers"] = [*message.get("headers", []), *(h for h in extra if h[0] not in present)]
            await send(message)

        await self.app(scope, receive, send_with_headers)


async def _answer(send: Send, code: int, detail: str, retry_after_s: int | None = None) -> None:
    body = (f'{{"detail": "{detail}"}}').encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if retry_after_s is not None:
        headers.append((b"retry-after", str(retry_after_s).encode()))
    await send({"type": "http.response.start", "status": code, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class SignInGuard:
    """POST /sign-in: at most `per_minute` attempts per client address (429 with Retry-After
    beyond), and a body of at most SIGN_IN_MAX_BYTES (413), both checked before the form is parsed.

    Attempts are counted per worker process; with N workers a client gets at most N times as many.
    """

    def __init__(self, app: ASGIApp, per_minute: int) -> None:
        self.app = app
        self.per_minute = per_minute
        self.attempts: dict[str, deque[float]] = {}

    def _retry_after(self, client: str) -> int | None:
        now = time.monotonic()
        if len(self.attempts) > MAX_TRACKED_CLIENTS:  # forget clients whose window has passed
            self.attempts = {c: a for c, a in self.attempts.items() if a and now - a[-1] < WINDOW_S}
        recent = self.attempts.setdefault(client, deque())
        while recent and now - recent[0] >= WINDOW_S:
            recent.popleft()
        if len(recent) >= self.per_minute:
            return max(1, math.ceil(WINDOW_S - (now - recent[0])))
        recent.append(now)
        return None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != SIGN_IN_PATH or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        client = scope["client"][0] if scope.get("client") else "unknown"
        wait = self._retry_after(client)
        if wait is not None:
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
