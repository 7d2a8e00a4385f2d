"""The agent's write API (docs/wire.md): runs and batches of interval records."""

import asyncio
import contextlib
import inspect
import re
import zlib
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response, status
from fastapi.exceptions import RequestValidationError
from fastapi.routing import APIRoute
from sqlalchemy import delete, insert
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Receive, Scope, Send

from packscope.backend.api.schemas import RUN_ID_PATTERN, IngestResult, RunCreate, RunPatch, RunSummary
from packscope.backend.http.deps import (
    RunIdPath,
    SessionDep,
    check_ingest_token,
    deleted_at,
    missing_run,
    require_ingest_token,
    run_gone,
    run_or_404,
    run_to_write,
)
from packscope.backend.ingest import contact
from packscope.backend.ingest.batches import ModelConflict, create_or_resume_run, patch_run
from packscope.backend.ingest.record import RecordError, batch_json_schema
from packscope.backend.ingest.rows import parse
from packscope.backend.reads.summaries import run_summary
from packscope.backend.store.models import deleted_runs

RUN_ID = re.compile(RUN_ID_PATTERN)
RUNS_PATH = "/api/v1/runs"  # POST: a run body, capped at PACKSCOPE_MAX_RUN_BODY_BYTES


# What is read and dropped of a body over the limit before the 413 (LimitedRequest._refusal_once_drained).
DRAIN_MAX_BYTES = 32 * 1024 * 1024
DRAIN_MAX_S = 5.0


def _too_large(limit: int) -> HTTPException:
    return HTTPException(
        status.HTTP_413_CONTENT_TOO_LARGE,
        detail=f"request body is larger than {limit} bytes (after gzip decompression); send fewer interval "
        "records per request (or a smaller run config), or raise PACKSCOPE_MAX_BODY_BYTES "
        "(PACKSCOPE_MAX_RUN_BODY_BYTES for POST /api/v1/runs) on the server",
        headers={"Connection": "close"},
    )


class _TooLarge(Exception):
    """The body read so far is over the limit."""


class LimitedRequest(Request):
    """A request whose body is gunzipped when sent with Content-Encoding: gzip, and capped in size.

    The cap applies to the decompressed bytes, read incrementally, so a small gzip bomb is refused
    before it fills memory.
    """

    async def body(self) -> bytes:
        if not hasattr(self, "_body"):
            settings = self.app.state.settings
            # A run body is small (a config is at most 256 KiB): a larger one is refused before it
            # is read and parsed, so that a few 8 MB configs cannot hold the server busy.
            limit: int = (
                settings.max_run_body_bytes
                if self.method == "POST" and self.scope["path"] == RUNS_PATH  # not self.url: built per request
                else settings.max_body_bytes
            )
            declared = self.headers.get("content-length")
            if declared is not None and declared.isdigit() and int(declared) > limit:
                raise await self._refusal_once_drained(limit)
            encoding = self.headers.get("content-encoding", "identity").strip().lower()
            if encoding not in ("gzip", "identity"):
                raise HTTPException(
                    status.HTTP_415_UNSUPPORTED_MEDIA_TYPE,
                    detail=f"Content-Encoding {encoding!r} is not supported; send gzip or no encoding",
                )
            try:
                self._body = await (self._gunzip(limit) if encoding == "gzip" else self._read(limit))
            except _TooLarge:
                raise await self._refusal_once_drained(limit) from None
        return self._body

    async def _refusal_once_drained(self, limit: int) -> HTTPException:
        """The 413, once the rest of the body is read and dropped (at most DRAIN_MAX_BYTES, for at
        most DRAIN_MAX_S): a client that sends its whole body before it reads (curl, the agent)
        would otherwise meet a connection reset, as a socket closed with unread bytes sends, instead
        of the answer. The answer closes the connection."""
        declared = self.headers.get("content-length", "")
        # _stream_consumed: Starlette's mark of a body received to its end (stream() then raises).
        if self._stream_consumed or (declared.isdigit() and int(declared) > DRAIN_MAX_BYTES):
            return _too_large(limit)
        drained = 0
        with contextlib.suppress(TimeoutError, ClientDisconnect):
            async with asyncio.timeout(DRAIN_MAX_S):
                async for chunk in self.stream():
                    drained += len(chunk)
                    if drained > DRAIN_MAX_BYTES:
                        break
        return _too_large(limit)

    async def _read(self, limit: int) -> bytes:
        out = bytearray()
        async for chunk in self.stream():
            out += chunk
            if len(out) > limit:
                raise _TooLarge
        return bytes(out)

    async def _gunzip(self, limit: int) -> bytes:
        inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)  # gzip framing only
        out = bytearray()
        try:
            async for chunk in self.stream():
                data = chunk
                while data and not inflate.eof:
                    out += inflate.decompress(data, limit + 1 - len(out))
                    if len(out) > limit:
                        raise _TooLarge
                    data = inflate.unconsumed_tail
        except zlib.error as exc:
            raise HTTPException(
                status.HTTP_400_BAD_REQUEST,
                detail=f"the body says Content-Encoding: gzip but does not decompress ({exc})",
            ) from None
        if not inflate.eof:
            raise HTTPException(status.HTTP_400_BAD_REQUEST, detail="the gzip body is truncated")
        return bytes(out)


Handler = Callable[[Request], Coroutine[Any, Any, Response]]


class LimitedRoute(APIRoute):
    def get_route_handler(self) -> Handler:
        lean: Handler | None = getattr(self.endpoint, "lean_handler", None)
        if lean is not None:  # the endpoint is declared for the OpenAPI document; this serves it
            bare = lean

            async def lean_handler(request: Request) -> Response:
                return await bare(LimitedRequest(request.scope, request.receive))

            return lean_handler
        handler = super().get_route_handler()

        async def limited_handler(request: Request) -> Response:
            return await handler(LimitedRequest(request.scope, request.receive))

        return limited_handler


router = APIRouter(
    prefix="/api/v1",
    tags=["ingest"],
    route_class=LimitedRoute,
    dependencies=[Depends(require_ingest_token)],
)


@router.post(
    "/runs",
    response_model=RunSummary,
    status_code=status.HTTP_201_CREATED,
    responses={200: {"description": "The run already existed (a resume)", "model": RunSummary}},
)
def create_run(
    body: RunCreate,
    session: SessionDep,
    response: Response,
    recreate: Annotated[
        bool, Query(description="create a run whose id was deleted (otherwise 410 Gone): its old data stays gone")
    ] = False,
    keep_status: Annotated[
        bool,
        Query(
            description="a run that exists keeps its status (the sender is not its trainer restarting: "
            "packscope sync or import); otherwise a resume marks it running again"
        ),
    ] = False,
) -> dict[str, Any]:
    when = deleted_at(session, body.run_id)
    if when is not None:
        if not recreate:
            raise run_gone(body.run_id, when)
        session.execute(delete(deleted_runs).where(deleted_runs.c.run_id == body.run_id))
        session.commit()
    try:
        run, created = create_or_resume_run(session, body, restart=not keep_status)
    except ModelConflict as exc:
        raise HTTPException(status.HTTP_409_CONFLICT, detail=str(exc)) from None
    if not created:
        response.status_code = status.HTTP_200_OK
    return run_summary(session, run)


def _inlined(schema: Any, defs: dict[str, Any]) -> Any:
    """A JSON schema with its local references ("#/$defs/...") replaced by what they name (the
    record has no recursion), so it stands alone inside the operation."""
    if isinstance(schema, dict):
        ref = schema.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inlined(defs[ref.removeprefix("#/$defs/")], defs)
        return {key: _inlined(value, defs) for key, value in schema.items() if key != "$defs"}
    if isinstance(schema, list):
        return [_inlined(item, defs) for item in schema]
    return schema


def _batch_body() -> dict[str, Any]:
    """The OpenAPI request body of a batch: the record's JSON schema (ingest/record.py), which the
    route does not declare as a parameter (it reads the raw body, rows.parse checks it)."""
    schema = batch_json_schema()
    return {
        "requestBody": {
            "required": True,
            "content": {"application/json": {"schema": _inlined(schema, schema.get("$defs", {}))}},
        }
    }


async def _post_intervals(request: Request) -> Response:
    """POST /runs/{run_id}/intervals as served: the router's dependency (the ingest token) checked
    by hand, in the order FastAPI checks it (before the body is read), and the endpoint's work,
    without FastAPI's dependency resolution per request (its CPU a batch:
    docs/benchmarks/2026-11-30-2core.md#dev-2026-11-30-1704-ingest-night)."""
    await check_ingest_token(request)
    run_id = request.path_params["run_id"]
    if not RUN_ID.fullmatch(run_id):  # as FastAPI answers RunIdPath's pattern
        raise RequestValidationError(
            [
                {
                    "type": "string_pattern_mismatch",
                    "loc": ("path", "run_id"),
                    "msg": f"String should match pattern '{RUN_ID_PATTERN}'",
                    "input": run_id,
                    "ctx": {"pattern": RUN_ID_PATTERN},
                }
            ]
        )
    return await post_intervals(run_id, request)


@router.post("/runs/{run_id}/intervals", response_model=IngestResult, openapi_extra=_batch_body())
async def post_intervals(run_id: RunIdPath, request: Request) -> Response:
    # The hot path, kept lean: served by _post_intervals (LimitedRoute), which calls this after the
    # token check with no dependency resolution; the raw body is validated once and laid out as
    # rows (rows.parse: the record's msgspec structs, checked; a RecordError names every problem)
    # before it queues for the database; batches queued together are stored together in
    # one worker-thread call on a Core connection (ingest.ingest_together, no session, no ORM
    # objects), and the answer is written without a response model pass.
    try:
        parsed = parse(await request.body())
    except RecordError as exc:
        # The same 422 body FastAPI gives for a bad body, every problem rooted at "body".
        raise RequestValidationError(
            [{"type": kind, "loc": ("body", *loc), "msg": message} for loc, message, kind in exc.problems]
        ) from None
    result = await request.app.state.batches.submit((run_id, parsed))
    if result is None:
        raise await run_in_threadpool(_missing_run, request.app.state.sessionmaker, run_id)
    if result.accepted:
        request.app.state.live.stored(run_id)  # committed: the run's open pages are told now
        request.app.state.alerts.wake(run_id)  # and its alert rules judge it, off this request
    # `ignored` only when the batch held fields the record does not know
    return Response(answer_json(result), media_type="application/json")


def answer_json(result: IngestResult) -> bytes:
    """The batch's answer as IngestResult.model_dump_json(exclude_defaults=True) writes it, the
    usual one (nothing ignored) without the model's serialiser."""
    if result.ignored:
        return result.model_dump_json(exclude_defaults=True).encode()
    return b'{"accepted":%d,"duplicates":%d}' % (result.accepted, result.duplicates)


post_intervals.lean_handler = _post_intervals  # type: ignore[attr-defined]
BATCH_PATH = re.compile(r"/api/v1/runs/([^/]+)/intervals")  # the route's path, {run_id} as Starlette matches it


class BatchFastPath:
    """An ASGI middleware, the innermost: POST /api/v1/runs/{run_id}/intervals goes straight to
    the lean handler, past FastAPI's exception and exit-stack middlewares and the router (which
    tries the app's routes one by one): 0.6 to 0.7 times the app's CPU a one-record request
    (docs/benchmarks/2026-12-06-2core-ranks.md#dev-2026-12-06-fanin). Every middleware outside it
    (the security guards) still runs; what the handler raises is answered by the app's own
    handlers, looked up as Starlette's exception middleware looks them up, and what none answers
    goes on up as it would from there. It steps aside where the route is not served leanly (a
    test's FastAPI baseline) and where the app is mounted under a root path."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        lean: Handler | None = getattr(post_intervals, "lean_handler", None)
        match = (
            BATCH_PATH.fullmatch(scope["path"])
            if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path") and lean
            else None
        )
        if match is None or lean is None:
            await self.app(scope, receive, send)
            return
        scope["path_params"] = {"run_id": match.group(1)}
        request = LimitedRequest(scope, receive)
        try:
            response = await lean(request)
        except Exception as exc:
            handler = _handler_of(scope["app"].exception_handlers, exc)
            if handler is None:
                raise
            answered = (
                handler(request, exc)
                if inspect.iscoroutinefunction(handler)
                else run_in_threadpool(handler, request, exc)
            )
            response = await answered
        await response(scope, receive, send)


def _handler_of(handlers: dict[Any, Callable[..., Any]], exc: Exception) -> Callable[..., Any] | None:
    """The app's handler of `exc`, as Starlette's ExceptionMiddleware finds it: an HTTPException's
    status first, then the exception's classes in method resolution order (500 and Exception
    belong to the server-error middleware outside)."""
    if isinstance(exc, StarletteHTTPException) and exc.status_code != 500:
        found = handlers.get(exc.status_code)
        if found is not None:
            return found
    for cls in type(exc).__mro__:
        if cls is not Exception and cls in handlers:
            return handlers[cls]
    return None


def _missing_run(make_session: sessionmaker[Session], run_id: str) -> HTTPException:
    with make_session() as session:
        return missing_run(session, run_id)


@router.patch("/runs/{run_id}", response_model=RunSummary)
def update_run(run_id: RunIdPath, body: RunPatch, session: SessionDep, request: Request) -> dict[str, Any]:
    """The agent sets status; the runs page edits name, notes, tags and archived."""
    run = run_to_write(session, run_id)
    given = body.model_fields_set
    if "name" in given:
        run.name = body.name
    if "notes" in given:
        run.notes = body.notes or ""
    if "tags" in given:
        run.tags = list(body.tags or [])
    if body.archived is not None:
        run.archived = body.archived
    contact.apply_layout(run, body)
    if body.status is not None:
        run = patch_run(session, run, body)  # also stamps ended_at and updated_at; commits
        request.app.state.alerts.wake(run_id)  # crashed opens (failed) or resolves (running, finished)
    else:
        session.commit()
    return run_summary(session, run)


@router.delete("/runs/{run_id}", status_code=status.HTTP_204_NO_CONTENT)
def delete_run(run_id: RunIdPath, session: SessionDep, request: Request) -> Response:
    """The run and everything of it: intervals, details, rollups, totals (ON DELETE CASCADE). Its
    id is kept in deleted_runs: an agent still sending is answered 410, not given a new run."""
    session.delete(run_or_404(session, run_id))
    session.execute(delete(deleted_runs).where(deleted_runs.c.run_id == run_id))
    session.execute(insert(deleted_runs).values(run_id=run_id, deleted_at=datetime.now(UTC)))
    session.commit()
    request.app.state.live.publish(run_id)  # its open streams end
    return Response(status_code=status.HTTP_204_NO_CONTENT)


# -- what the agent says beside its records (backend/ingest/contact.py) -----------------------------------
@router.post("/runs/{run_id}/heartbeat", status_code=status.HTTP_204_NO_CONTENT)
def heartbeat(run_id: RunIdPath, body: contact.Heartbeat, session: SessionDep) -> Response:
    """The agent is alive: a run that stops sending these (and records) is shown stale, then crashed."""
    contact.record_heartbeat(session, run_to_write(session, run_id), body)
    return Response(status_code=status.HTTP_204_NO_CONTENT)


@router.post("/runs/{run_id}/refusals", status_code=status.HTTP_204_NO_CONTENT)
def refusals(run_id: RunIdPath, body: contact.Refusals, session: SessionDep) -> Response:
    """Intervals the agent or the server refused; the run page says how many and why."""
    contact.record_refusals(session, run_to_write(session, run_id), body)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
