"""The JSON read API (docs/api.md), the CSV export and the live stream."""

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, status
from fastapi.responses import StreamingResponse
from pydantic import BaseModel, create_model
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool

from packscope.backend.api.schemas import (
    Comparison,
    IntervalHistograms,
    RunId,
    RunListed,
    RunPage,
    RunSummary,
    SeenLayout,
    Series,
    SeriesColumns,
    ShownStatus,
    SyncSites,
)
from packscope.backend.api.text import NO_NUL_PATTERN
from packscope.backend.http.csv_streams import start_export
from packscope.backend.http.deps import (
    RunIdPath,
    SessionDep,
    SettingsDep,
    require_read_token,
    run_not_found,
    run_or_404,
)
from packscope.backend.http.live import LiveHub
from packscope.backend.http.security import client_of
from packscope.backend.reads import (
    facets,
    histograms,
    runs_list,
    series,
    step_times,
    stream_state,
    summaries,
    sync_sites,
)
from packscope.backend.store.runs import get_run as stored_run  # get_run is this module's route
from packscope.core import catalogue
from packscope.core.catalogue import INT32_MAX, INT64_MAX

log = logging.getLogger("packscope.backend")

router = APIRouter(prefix="/api/v1", tags=["reads"], dependencies=[Depends(require_read_token)])

MAX_COMPARE = 20
MAX_CONFIG_KEYS = 20
# Dotted object keys of letters, digits, '_' and '-' (what a JSON path can name on both databases).
CONFIG_KEY = r"[A-Za-z0-9_-]{1,100}(\.[A-Za-z0-9_-]{1,100}){0,9}"
CONFIG_KEYS_PATTERN = f"^{CONFIG_KEY}(,{CONFIG_KEY}){{0,{MAX_CONFIG_KEYS - 1}}}$"
HISTOGRAM_COLUMNS = 200  # the heatmap's default: enough to see a trend, 200 JSON rows per rank to read


# The dashboard's additions to schemas.Series (the wall-clock extent of each point, the run's
# first start, per-channel loss), kept beside the routes that answer them.
SeriesTimedColumns = create_model(
    "SeriesTimedColumns",
    __base__=SeriesColumns,
    wall_start_min=(list[float | None], ...),
    wall_end_max=(list[float | None], ...),
)


class SeriesRead(Series):
    columns: SeriesTimedColumns  # type: ignore[valid-type]
    wall_origin: float | None  # unix time of the run's first interval start
    channel_loss: dict[str, list[float | None]]  # Σ mean·tokens / Σ tokens per point
    channel_tokens: dict[str, list[float]]  # Σ tokens per point


# What the dashboard adds to schemas.RunSummary: liveness, the layout's provenance, the windows
# its numbers cover, refused intervals and picked config values (summaries._summary fills them).
class RefusalReason(BaseModel):
    by: Literal["agent", "server"]
    reason: str
    intervals: int


class RefusedIntervals(BaseModel):
    intervals: int  # intervals (per rank) that will never be stored
    first_step: int
    last_step: int
    reasons: list[RefusalReason]  # most frequent first


class RunFacts(BaseModel):
    last_contact_at: datetime  # the agent's last heartbeat, record or status; stale/crashed count from it
    heartbeat_s: float | None  # the heartbeat period the agent promised (None: an older agent)
    layout_declared: str  # what the run registered with; `layout` is what its batches were
    pack_length: int | None  # the pack length the baseline counted; None: the rows as the model ran them
    pack_length_from: str | None
    # kept, crossed (packed documents attended to each other: a training bug) or not checked; None:
    # no check reported (an agent without one, or a run of no packed batches)
    cross_documents: str | None
    cross_documents_detail: str | None
    first_step: int | None  # the first stored step: `totals` cover first_step..last_step
    steady_first_step: int | None  # `steady` covers steady_first_step..last_step
    refused: RefusedIntervals | None


class RunRead(RunSummary, RunFacts):
    """A run with its config (GET /api/v1/runs/{id}, compare)."""


class RunListedRead(RunListed, RunFacts):
    """A run of the runs list: no config, the config_keys' values asked for."""


class RunPageRead(RunPage):
    runs: list[RunListedRead]  # type: ignore[assignment]


class ComparisonRead(Comparison):
    runs: list[RunRead]  # type: ignore[assignment]


class SyncSitesRead(SyncSites):
    window: Literal["steady", "run"]  # steady: the first interval (warm-up) left out
    first_step: int | None  # the steps the counts cover
    last_step: int | None
    # The share of those steps whose syncs the agent counted (it counts one interval in a few:
    # AgentConfig.count_syncs_every); per_iter divides by these steps only.
    counted_share: float | None


class Facet(BaseModel):
    value: str
    runs: int


class Facets(BaseModel):
    projects: list[Facet]
    tags: list[Facet]


class HistogramSeries(BaseModel):
    count: list[list[int]]  # one row of buckets per shown interval
    tokens: list[list[int]]


class HistogramColumns(BaseModel):
    first_interval: int
    last_interval: int
    intervals: list[int]
    first_step: list[int]
    last_step: list[int]
    edges: list[int]
    documents: HistogramSeries
    packs: HistogramSeries


@router.get("/catalogue")
def get_catalogue() -> dict[str, Any]:
    """Every interval field and derived metric: name, label, unit, display format, definition."""
    return catalogue.as_json()


@router.get("/runs", response_model=RunPageRead)
def list_runs(
    session: SessionDep,
    sort: Annotated[
        str,
        Query(
            pattern=runs_list.SORT_PATTERN,
            max_length=64,
            description="a RunSummary column or totals metric; a leading '-' sorts descending",
        ),
    ] = runs_list.DEFAULT_SORT,
    project: Annotated[str | None, Query(max_length=200, pattern=NO_NUL_PATTERN)] = None,
    tag: Annotated[str | None, Query(max_length=100, pattern=NO_NUL_PATTERN)] = None,
    layout: SeenLayout | None = None,
    status: ShownStatus | None = None,
    q: Annotated[
        str | None, Query(max_length=200, pattern=NO_NUL_PATTERN, description="text in the name, run_id or a tag")
    ] = None,
    archived: Annotated[bool, Query(description="include archived runs")] = False,
    alerts: Annotated[Literal["open"] | None, Query(description="open: only the runs with an open alert")] = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
    offset: Annotated[int, Query(ge=0, le=INT32_MAX)] = 0,
    config_keys: Annotated[
        str | None,
        Query(
            pattern=CONFIG_KEYS_PATTERN,
            max_length=2000,
            description=f"comma-separated dotted config keys (e.g. lr,optimizer.name), at most {MAX_CONFIG_KEYS}: "
            "each run's `config_values` holds their values",
        ),
    ] = None,
) -> dict[str, Any]:
    """The runs, without their configs; `config_keys` picks config values to show or group by."""
    filters = runs_list.RunFilters(
        project=project, tag=tag, layout=layout, status=status, q=q, archived=archived, alerting=alerts == "open"
    )
    runs, total = runs_list.list_runs(session, filters, sort, limit, offset)
    keys = list(dict.fromkeys(config_keys.split(","))) if config_keys else []
    values = runs_list.config_values(session, runs, keys)
    listed = summaries.run_summaries(session, runs, with_config=False)
    for run, summary in zip(runs, listed, strict=True):
        summary["config_values"] = values.get(run.id, {})
    return {"runs": listed, "total": total}


@router.get("/facets", response_model=Facets)
def get_facets(
    session: SessionDep, archived: Annotated[bool, Query(description="count archived runs too")] = False
) -> dict[str, Any]:
    """The distinct projects and tags of the runs, each with its number of runs."""
    return facets.facets(session, archived)


@router.get("/runs/{run_id}", response_model=RunRead)
def get_run(run_id: RunIdPath, session: SessionDep) -> dict[str, Any]:
    return summaries.run_summary(session, run_or_404(session, run_id))


@router.get("/runs/{run_id}/series", response_model=SeriesRead)
def get_series(
    run_id: RunIdPath,
    session: SessionDep,
    max_points: Annotated[int, Query(ge=1, le=10_000)] = 500,
    step_min: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
    step_max: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
) -> dict[str, Any]:
    run = run_or_404(session, run_id)
    return series.series(session, run, max_points, step_min, step_max)


def _found(found: dict[str, Any] | None, run_id: str, missing: str = "has no intervals yet") -> dict[str, Any]:
    """What a run's read found, or 404 saying what the run lacks."""
    if found is None:
        raise HTTPException(status.HTTP_404_NOT_FOUND, detail=f"run {run_id!r} {missing}")
    return found


@router.get("/runs/{run_id}/histograms", response_model=IntervalHistograms)
def get_histograms(
    run_id: RunIdPath, session: SessionDep, interval: Annotated[int | None, Query(ge=0, le=INT32_MAX)] = None
) -> dict[str, Any]:
    missing = "has no intervals yet" if interval is None else f"has no interval {interval}"
    return _found(histograms.histograms(session, run_or_404(session, run_id), interval), run_id, missing)


@router.get("/runs/{run_id}/histograms/over-time", response_model=HistogramColumns)
def get_histogram_columns(
    run_id: RunIdPath,
    session: SessionDep,
    columns: Annotated[int, Query(ge=1, le=1000, description="intervals shown, spread evenly")] = HISTOGRAM_COLUMNS,
) -> dict[str, Any]:
    return _found(histograms.histogram_columns(session, run_or_404(session, run_id), columns), run_id)


@router.get("/runs/{run_id}/sync-sites", response_model=SyncSitesRead)
def get_sync_sites(
    run_id: RunIdPath,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=1000)] = 10,
    window: Annotated[
        Literal["steady", "run"], Query(description="steady: without the first interval (as the run's rates)")
    ] = "run",
) -> dict[str, Any]:
    return sync_sites.sync_sites(session, run_or_404(session, run_id), limit, window)


@router.get("/compare", response_model=ComparisonRead)
def compare(
    session: SessionDep,
    run_id: Annotated[list[RunId], Query(min_length=1, max_length=MAX_COMPARE)],
    window: Annotated[int, Query(ge=2, le=100_000, description="intervals per run in the step-time test")] = 200,
) -> dict[str, Any]:
    runs, missing = runs_list.find_runs(session, run_id)
    if missing:
        raise HTTPException(
            status.HTTP_404_NOT_FOUND,
            detail=f"run(s) not stored: {', '.join(missing)}; GET /api/v1/runs lists the runs",
        )
    return {
        "runs": summaries.run_summaries(session, runs),
        "step_time_tests": step_times.step_time_tests(session, runs, window),
    }


@router.get(
    "/runs/{run_id}/intervals.csv",
    response_class=StreamingResponse,
    responses={
        200: {"content": {"text/csv": {}}, "description": "One row per stored interval"},
        429: {"description": "This client has PACKSCOPE_CSV_STREAMS_PER_CLIENT exports streaming already"},
    },
)
async def intervals_csv(run_id: RunIdPath, request: Request) -> StreamingResponse:
    # Written to a temporary file at the database's pace, sent at the reader's (csv_streams.py).
    state = request.app.state
    limits = state.csv_limits
    release = limits.claim(client_of(request.scope))
    try:
        started = await start_export(state.admission, state.sessionmaker, run_id, limits.writers)
    except BaseException:
        release()
        raise
    if started is None:
        release()
        raise run_not_found(run_id)
    spool, writer = started
    return StreamingResponse(
        spool.chunks(writer, on_close=release),
        media_type="text/csv; charset=utf-8",
        headers={"Content-Disposition": f'attachment; filename="{run_id}.csv"'},
    )


# An event that announces at most this many new intervals carries their series, so the run page
# draws them without asking (about 2 kB of JSON an interval, sent to every stream of the run);
# after a larger gap the page asks for them, as it does after a reconnect.
EVENT_SERIES_INTERVALS = 64
EVENT_SERIES_POINTS = 500  # the run page's max_points (frontend/static/run_sizes.js' SERIES_POINTS)

# What a stream watches: (the run's primary key, stream_state's rows, latest interval, latest
# step). The key tells a run deleted and made again under the same id from the one before.
StreamState = tuple[int, int, int | None, int | None]


def _event(data: dict[str, Any]) -> str:
    return f"event: interval\ndata: {json.dumps(data)}\n\n"


async def _event_text(
    run_id: str,
    before: StreamState | None,
    state: StreamState,
    live: LiveHub,
    read_series: Callable[[int, int], dict[str, Any] | None],
) -> str:
    """The event for `state`, after `before` (what the stream saw last; None: nothing yet).

    Where the stream saw the run up to a step and a few intervals followed, the event carries
    their series (`after_step`, `series`): the series endpoint's answer for step_min=after_step+1,
    step_max=last_step, made by the same code, once in this process for all its streams of the run
    (EventTexts). Else, or where it cannot be read, the event names the new state alone and the
    page asks for the series."""
    pk, _, interval, last_step = state
    data = {"run_id": run_id, "interval": interval, "last_step": last_step}
    if (
        before is None
        or before[0] != pk
        or before[2] is None
        or before[3] is None
        or interval is None
        or last_step is None
        or last_step <= before[3]
        or interval - before[2] > EVENT_SERIES_INTERVALS
    ):
        return _event(data)
    after = before[3]

    def make() -> str:
        found = read_series(after, last_step)
        return _event(data if found is None else {**data, "after_step": after, "series": found})

    try:
        return await live.texts.text((run_id, after, state), make)
    except Exception as exc:  # noqa: BLE001 - the page asks for what the event lacks
        log.warning("live stream of %s: the event's series could not be read (%s); sent without it", run_id, exc)
        return _event(data)


async def _events(
    run_id: str,
    read_state: Callable[[], StreamState | None],
    read_series: Callable[[int, int], dict[str, Any] | None],
    live: LiveHub,
    poll_s: float,
    keepalive_s: float,
) -> AsyncIterator[str]:
    """SSE: an `interval` event whenever the stored intervals change, comments in between.

    The stream sleeps until the live hub says the run was written to (live.py), then reads the
    run's state; without a push between processes it reads every poll_s instead. The first read
    also sends the current state, which closes the gap between the page's first fetch and the
    moment the stream opened.
    """
    with live.subscribe(run_id) as woken:
        last: StreamState | None = None
        last_sent = time.monotonic()
        while True:
            woken.clear()  # before reading: a wake-up during the read means read again
            state = await run_in_threadpool(read_state)
            if state is None:  # the run is gone
                return
            if state[1] and state != last:
                yield await _event_text(run_id, last, state, live, read_series)
                last_sent = time.monotonic()
            elif time.monotonic() - last_sent >= keepalive_s:
                yield ": keep-alive\n\n"  # proxies close connections that stay silent
                last_sent = time.monotonic()
            last = state
            until_keepalive = max(0.0, keepalive_s - (time.monotonic() - last_sent))
            # asyncio.timeout, not wait_for, which on Python 3.11 can swallow the cancellation of a
            # stream whose client left (backend/alerts/worker.py's _wait says how).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(until_keepalive if live.pushes else min(poll_s, until_keepalive)):
                    await woken.wait()


@router.get(
    "/runs/{run_id}/stream",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}, "description": "Server-Sent Events"}},
)
async def stream(run_id: RunIdPath, request: Request, settings: SettingsDep) -> StreamingResponse:
    make_session: sessionmaker[Session] = request.app.state.sessionmaker

    def read_state() -> StreamState | None:
        with make_session() as session:
            run = stored_run(session, run_id)
            return None if run is None else (run.id, *stream_state.stream_state(session, run))

    def read_series(after_step: int, last_step: int) -> dict[str, Any] | None:
        """What GET series?max_points=EVENT_SERIES_POINTS&step_min=after_step+1&step_max=last_step answers."""
        with make_session() as session:
            run = stored_run(session, run_id)
            if run is None:
                return None
            found = series.series(session, run, EVENT_SERIES_POINTS, after_step + 1, last_step)
            return SeriesRead.model_validate(found).model_dump(mode="json")

    if await run_in_threadpool(read_state) is None:
        raise run_not_found(run_id)
    live = request.app.state.live
    return StreamingResponse(
        _events(run_id, read_state, read_series, live, settings.stream_poll_s, settings.stream_keepalive_s),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
