"""The FastAPI application: JSON API, dashboards and static assets over one database."""

import functools
import gc
import logging
import math
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles
from starlette.middleware.errors import ServerErrorMiddleware
from starlette.types import ASGIApp, Receive, Scope, Send

from packscope import __version__
from packscope.backend.alerts.worker import AlertWorker
from packscope.backend.http import openapi
from packscope.backend.http.admission import Admission, Coalescer
from packscope.backend.http.allowed_methods import add_allowed_methods_handler
from packscope.backend.http.csv_streams import CsvLimits
from packscope.backend.http.errors import add_database_error_handlers
from packscope.backend.http.live import LiveHub, transport_for
from packscope.backend.http.security import SecurityHeaders, SignInGuard, TokenGuard, WriteGuard, read_cookie_value
from packscope.backend.http.settings import Settings
from packscope.backend.ingest.batches import ingest_together
from packscope.backend.routes import ingest, pages, reads
from packscope.backend.routes.alerts import router as alerts_router
from packscope.backend.routes.ledger import router as ledger_router
from packscope.backend.routes.ranks import router as ranks_router
from packscope.backend.store.db import WRITES, make_engine, make_sessionmaker, upgrade_schema
from packscope.frontend import STATIC_DIR

log = logging.getLogger("packscope.backend")
# The collector's thresholds while the app serves (gc.set_threshold): a young collection once
# 20,000 more containers were made than freed, not 700, and each older generation's after 20 of
# the one below (docs/benchmarks/2026-12-06-2core-ranks.md#dev-2026-12-06-fanin-gc).
GC_THRESHOLDS = (20_000, 20, 20)


class _ServingCollector:
    """The collector's settings while any app of this process serves (tests run several, and
    their lifespans overlap): the first to start freezes what exists and raises the thresholds,
    the last to stop gives both back."""

    def __init__(self) -> None:
        self._lock = threading.Lock()  # each TestClient runs its app's lifespan in a thread of its own
        self._apps = 0
        self._thresholds: tuple[int, ...] = ()

    def serving(self) -> None:
        with self._lock:
            self._apps += 1
            if self._apps > 1:
                return
            # What exists once the app is built (modules, the app, its caches: about 160,000
            # objects) lives until shutdown; frozen, full collections skip it, so one costs a small
            # part of what it did (docs/benchmarks/2026-11-30-2core.md#dev-2026-11-30-2020-gc-freeze).
            gc.freeze()
            # Fewer collections while serving: at the default thresholds a young one ran every ten
            # or so requests and a full one (every object made since the freeze) every thousand or
            # so, each a stall of the event loop, while what a request makes is freed by reference
            # counting anyway (GC_THRESHOLDS' log).
            self._thresholds = gc.get_threshold()
            gc.set_threshold(*GC_THRESHOLDS)

    def done(self) -> None:
        with self._lock:
            self._apps -= 1
            if self._apps == 0:
                gc.set_threshold(*self._thresholds)
                gc.unfreeze()  # their objects collectable again


_COLLECTOR = _ServingCollector()
OPEN_WRITES_WARNING = (
    "PACKSCOPE_INGEST_TOKEN is not set: anyone who can reach this server can create, change and delete "
    "runs. Set PACKSCOPE_INGEST_TOKEN (and give the same token to the agents) before other people can reach it."
)


def _echo(value: Any) -> Any:
    """What a 422 repeats of the offending input: scalars only, and JSON-safe."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value if isinstance(value, str | int | float | bool) or value is None else "..."


def _encodable(value: Any) -> Any:
    """`value` with every string UTF-8 can encode: a lone surrogate (a JSON "\\udfff" escape, in
    a value, a key the `loc` names or a message quoting it) is written out as its escape."""
    if isinstance(value, str):
        return value.encode("utf-8", "backslashreplace").decode()
    if isinstance(value, list):
        return [_encodable(item) for item in value]
    if isinstance(value, dict):
        return {_encodable(key): _encodable(item) for key, item in value.items()}
    return value


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    # Pydantic's list of what is wrong, without echoing whole records (a batch can be megabytes)
    # and without NaN/inf, which JSON cannot carry.
    assert isinstance(exc, RequestValidationError)
    errors = [{**e, "input": _echo(e.get("input"))} for e in exc.errors()]
    detail = _encodable(jsonable_encoder(errors))
    return JSONResponse(status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, content={"detail": detail})


class PackscopeApp(FastAPI):
    """FastAPI, with a batch POST (routes/ingest.py's BatchFastPath) handed from here straight to
    the outermost of the app's own middlewares (the security guards, whose instances every
    request shares): FastAPI's and Starlette's layers above them (the telemetry hooks, the body
    limit, which this app leaves unset) do nothing for it but cost CPU, a one-record request from
    every rank of a large job (issue 39). Starlette's server-error middleware stays around it,
    and the route takes the ordinary way whenever FastAPI's native telemetry is configured (its
    requests traced as every other), under a root path, or where BatchFastPath is not installed."""

    _batch_stack: ASGIApp | None = None

    def build_middleware_stack(self) -> ASGIApp:
        stack = super().build_middleware_stack()
        self._batch_stack = None
        classes: list[Any] = [m.cls for m in self.user_middleware]
        if ingest.BatchFastPath not in classes or getattr(self, "max_body_size", None) is not None:
            return stack
        guards = stack
        while type(guards) is not classes[0]:  # the outermost of the app's own middlewares
            guards = getattr(guards, "app")  # noqa: B009 - every layer above it has one
        error_handler = next((v for k, v in self.exception_handlers.items() if k in (500, Exception)), None)
        self._batch_stack = ServerErrorMiddleware(guards, handler=error_handler, debug=self.debug)
        return stack

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        batch = self._batch_stack
        if (
            batch is not None
            and scope["type"] == "http"
            and scope["method"] == "POST"
            and not self.root_path
            and not scope.get("root_path")
            and ingest.BATCH_PATH.fullmatch(scope["path"])
            and not self._traced(scope)
        ):
            scope["app"] = self
            await batch(scope, receive, send)
            return
        await super().__call__(scope, receive, send)

    def _traced(self, scope: Scope) -> bool:
        """Whether FastAPI's native telemetry (FastAPI 0.16x) would see this request."""
        telemetry = getattr(self, "_native_telemetry", None)
        return "fastapi.telemetry" in scope or (telemetry is not None and telemetry.enabled())


def create_app(settings: Settings | None = None) -> FastAPI:
    """An app over `settings.database_url` (default: PACKSCOPE_* environment variables).

    The schema is brought to the latest migration here, so a fresh database works at once.
    """
    settings = settings or Settings()
    engine = make_engine(
        settings.database_url,
        pool_size=settings.db_slots,
        pool_timeout_s=settings.pool_wait_s,
        sqlite_busy_s=settings.sqlite_busy_s,
    )
    upgrade_schema(engine)
    live = LiveHub(transport_for(engine))
    alert_worker = AlertWorker(engine, settings.alert_config())
    if settings.writes_open:
        log.warning(OPEN_WRITES_WARNING)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        _COLLECTOR.serving()  # what exists now frozen, fewer collections: while any app serves
        await live.start()
        await alert_worker.start()
        try:
            yield
        finally:
            await alert_worker.stop()
            await live.stop()
            _COLLECTOR.done()
            engine.dispose()

    app = PackscopeApp(
        title="packscope",
        version=__version__,
        summary="How fast is this training run, really?",
        lifespan=lifespan,
    )
    app.add_exception_handler(RequestValidationError, _validation_error)
    add_database_error_handlers(app)
    add_allowed_methods_handler(app)
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessionmaker = make_sessionmaker(engine)
    app.state.write_sessionmaker = make_sessionmaker(engine, writes=True)
    app.state.live = live  # new intervals wake the open streams of every process (live.py)
    app.state.alerts = alert_worker  # new intervals wake this process's alert rules (alerts/worker.py)
    app.state.csv_limits = CsvLimits(settings.csv_streams, settings.csv_streams_per_client, settings.retry_after_s)
    app.state.admission = Admission(
        slots=settings.db_slots,
        wait_s=settings.queue_wait_s,
        retry_after_s=settings.retry_after_s,
        serialise_writes=engine.dialect.name == "sqlite",
    )
    # Batches of interval records: Core on a write connection, no session; those that arrive
    # while others are stored are stored together (routes/ingest.py).
    app.state.batches = Coalescer(
        app.state.admission,
        functools.partial(ingest_together, engine.execution_options(**{WRITES: True})),
        weigh=lambda batch: len(batch[1]),
        max_weight=settings.coalesce_rows,
    )
    app.include_router(ingest.router)
    app.include_router(reads.router)
    app.include_router(ranks_router)
    app.include_router(ledger_router)
    app.include_router(alerts_router)
    app.include_router(pages.public)
    app.include_router(pages.router)
    app.add_exception_handler(pages.SignInRequired, pages.sign_in_required)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    # Outermost last: every refusal below still carries the security headers. Innermost, inside
    # every guard: the batch route served without the router (routes/ingest.py).
    app.add_middleware(ingest.BatchFastPath)
    app.add_middleware(SignInGuard, per_minute=settings.sign_in_per_minute)
    app.add_middleware(
        TokenGuard,
        per_minute=settings.token_failures_per_minute,
        bearer_tokens=(settings.ingest_token, settings.read_token),
        read_cookie=read_cookie_value(settings.read_token) if settings.read_token else None,
    )
    app.add_middleware(WriteGuard, allowed_origins=settings.allowed_origin_set)
    app.add_middleware(SecurityHeaders)
    app.openapi = lambda: openapi.document(app, settings)  # type: ignore[method-assign]
    return app
