"""Read queries (a chart's series: backend/reads/series.py). Summaries read the run totals; every derived
number comes from the catalogue's formulas (catalogue.derive on floats)."""

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, NamedTuple, cast

import numpy as np
from sqlalchemy import Select, bindparam, distinct, exists, func, literal, or_, select, true
from sqlalchemy.orm import Session, defer

from packscope.backend.reads.stats import mann_whitney_u
from packscope.backend.store.models import (
    Run,
    interval_details,
    intervals,
    refused_intervals,
    run_sync_sites,
    run_totals,
)
from packscope.backend.store.runs import coefficients
from packscope.core.catalogue import (
    FIELDS,
    FLOAT_OPS,
    METRIC,
    METRICS,
    SUM_FIELDS,
    SUM_NAMES,
    Coefficients,
    derive,
    sums_of_rows,
    sync_counted_steps,
)
from packscope.core.histograms import EDGES, KINDS, NUM_BUCKETS

# The CSV: every stored column of the catalogue, then every derived metric of the interval.
CSV_RAW_COLUMNS = (*(f.name for f in FIELDS), "channel_loss", "channel_tokens")
CSV_DERIVED_COLUMNS = tuple(m.name for m in METRICS if m.name not in CSV_RAW_COLUMNS)
CSV_COLUMNS = CSV_RAW_COLUMNS + CSV_DERIVED_COLUMNS


def _utc(moment: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes (stored in UTC), PostgreSQL ones in the session's zone.
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


# -- runs -----------------------------------------------------------------------------------------
class FirstInterval(NamedTuple):
    """A run's first interval (every rank's rows): warm-up, which the steady rates leave out."""

    rows: int
    sums: dict[str, float]
    first_step: int
    last_step: int
    sync_sites: dict[str, int]  # summed over its rows (first_interval_sums(with_sites=True), else empty)


# One min() per run, each a seek on the index (a GROUP BY would walk every row of the runs).
_FIRST_INTERVALS = select(
    Run.id, select(func.min(intervals.c.interval)).where(intervals.c.run_pk == Run.id).scalar_subquery()
).where(Run.id.in_(bindparam("pks", expanding=True)))
# Two IN lists seek the index (a row-value IN list made SQLite scan the table); the rows of
# another run's first interval that they also match are dropped after.
_FIRST_ROWS = select(
    intervals.c.run_pk,
    intervals.c.interval,
    intervals.c.first_step,
    intervals.c.last_step,
    *(intervals.c[name] for name in SUM_FIELDS),
).where(
    intervals.c.run_pk.in_(bindparam("pks", expanding=True)),
    intervals.c.interval.in_(bindparam("intervals", expanding=True)),
)
# The sites are JSON in another table: read and decoded only when asked for.
_FIRST_ROWS_WITH_SITES = _FIRST_ROWS.add_columns(interval_details.c.sync_sites).join(
    interval_details, interval_details.c.interval_id == intervals.c.id
)


def first_interval_sums(
    session: Session, run_pks: Sequence[int], *, with_sites: bool = False
) -> dict[int, FirstInterval]:
    """Per run: the rows of its first interval (every rank's), their SUMS, steps and (with
    `with_sites`, else none) sync sites, from the unique (run_pk, interval, rank) index: a few rows per
    run whatever its length."""
    if not run_pks:
        return {}
    firsts = session.execute(_FIRST_INTERVALS, {"pks": list(run_pks)})
    first_of = {pk: interval for pk, interval in firsts if interval is not None}
    if not first_of:
        return {}
    query = _FIRST_ROWS_WITH_SITES if with_sites else _FIRST_ROWS
    rows: dict[int, list[Mapping[str, Any]]] = {}
    for row in session.execute(query, {"pks": list(first_of), "intervals": list(set(first_of.values()))}):
        if row.interval == first_of[row.run_pk]:
            rows.setdefault(row.run_pk, []).append(dict(row._mapping))
    out = {}
    for pk, found in rows.items():
        sites: dict[str, int] = {}
        for one in found if with_sites else ():
            for site, n in (one["sync_sites"] or {}).items():
                sites[site] = sites.get(site, 0) + int(n)
        first_step = int(min(r["first_step"] for r in found))
        last_step = int(max(r["last_step"] for r in found))
        out[pk] = FirstInterval(len(found), sums_of_rows(found), first_step, last_step, sites)
    return out


def steady_sums(totals: Mapping[str, Any], first: FirstInterval | None) -> dict[str, float] | None:
    """The run's SUMS without its first interval: what its rates are once warm-up (allocation,
    compilation, graph capture, the first data) is over. None while it has only one interval."""
    if first is None or int(totals["rows"]) <= first.rows:
        return None
    out = {}
    for name in SUM_NAMES:
        whole, head = float(totals[name]), float(first.sums[name])
        rest = whole - head
        # The stored total was summed in another order: a remainder within its rounding is 0.
        out[name] = 0.0 if abs(rest) <= 8 * math.ulp(max(abs(whole), abs(head))) else rest
    return out


# -- liveness ---------------------------------------------------------------------------------------
DEFAULT_HEARTBEAT_S = 30.0  # what the agent promises by default; runs of older agents are judged by it
STALE_BEATS = 3  # a running run is stale once this many heartbeats are missing...
CRASHED_BEATS = 10  # ...and crashed once this many are


def last_contact(run: Run) -> datetime:
    """When the run's agent last reached the server: a heartbeat, a refusal report, or (updated_at)
    its registration, a new record or a status."""
    return _latest(run.updated_at, run.last_contact_at)


def _latest(updated_at: datetime, last_contact_at: datetime | None) -> datetime:
    moments = [m for m in (_utc(updated_at), _utc(last_contact_at)) if m is not None]
    return max(moments)


def shown_status(run: Run, now: datetime) -> str:
    """The status the pages show: a running run whose agent stopped calling is "stale" after
    STALE_BEATS missed heartbeats and "crashed" after CRASHED_BEATS; contact makes it running again."""
    return _liveness(run.status, run.updated_at, run.last_contact_at, run.heartbeat_s, now)


def _liveness(
    status: str, updated_at: datetime, last_contact_at: datetime | None, heartbeat_s: float | None, now: datetime
) -> str:
    if status != "running":
        return status
    silent = (now - _latest(updated_at, last_contact_at)).total_seconds()
    beat = heartbeat_s or DEFAULT_HEARTBEAT_S
    if silent >= CRASHED_BEATS * beat:
        return "crashed"
    if silent >= STALE_BEATS * beat:
        return "stale"
    return "running"


_REFUSALS = (
    select(
        refused_intervals.c.run_pk,
        refused_intervals.c.refused_by,
        refused_intervals.c.reason,
        func.count(),
        func.min(refused_intervals.c.first_step),
        func.max(refused_intervals.c.last_step),
    )
    .where(refused_intervals.c.run_pk.in_(bindparam("pks", expanding=True)))
    .group_by(refused_intervals.c.run_pk, refused_intervals.c.refused_by, refused_intervals.c.reason)
)


def refusals(session: Session, run_pks: Sequence[int]) -> dict[int, dict[str, Any]]:
    """Per run with refused intervals: how many, their step span, and the most frequent reason."""
    if not run_pks:
        return {}
    rows = session.execute(_REFUSALS, {"pks": list(run_pks)}).all()
    out: dict[int, dict[str, Any]] = {}
    for pk, by, reason, n, first_step, last_step in rows:
        found = out.setdefault(pk, {"intervals": 0, "first_step": first_step, "last_step": last_step, "reasons": []})
        found["intervals"] += int(n)
        found["first_step"] = min(found["first_step"], first_step)
        found["last_step"] = max(found["last_step"], last_step)
        found["reasons"].append({"by": by, "reason": reason, "intervals": int(n)})
    for found in out.values():
        found["reasons"].sort(key=lambda r: (-r["intervals"], r["reason"]))
    return out


def _summary(
    run: Run,
    sums: Mapping[str, Any] | None,
    first: FirstInterval | None,
    refused: dict[str, Any] | None,
    now: datetime,
    with_config: bool = True,
) -> dict[str, Any]:
    c = coefficients(run)
    totals = None if sums is None else derive(sums, c)
    steady = None if sums is None else steady_sums(sums, first)
    summary = {
        "run_id": run.run_id,
        "name": run.name,
        "project": run.project,
        "tags": run.tags,
        "layout": run.layout_seen or run.layout,
        "layout_declared": run.layout,
        "pack_length": run.pack_length,
        "pack_length_from": run.pack_length_from,
        "status": shown_status(run, now),
        "last_contact_at": last_contact(run),
        "heartbeat_s": run.heartbeat_s,
        "started_at": _utc(run.started_at),
        "ended_at": _utc(run.ended_at),
        "updated_at": _utc(run.updated_at),
        "model": run.model,
        "hardware": run.hardware,
        "parallel": run.parallel,
        "c_lin": c.c_lin,
        "c_core": c.c_core,
        "records": 0 if sums is None else int(sums["rows"]),
        "first_step": None if first is None else first.first_step,
        "last_step": None if sums is None else int(sums["last_step"]),
        "totals": totals,
        # The steady window starts after the first interval: the pages say so beside its numbers.
        "steady": None if steady is None else derive(steady, c),
        "steady_first_step": None if steady is None or first is None else first.last_step + 1,
        "refused": refused,
        "notes": run.notes,
        "archived": run.archived,
    }
    if with_config:
        summary["config"] = run.config
    return summary


_TOTALS_OF_RUNS = select(run_totals).where(run_totals.c.run_pk.in_(bindparam("pks", expanding=True)))


def run_summaries(session: Session, runs: Sequence[Run], *, with_config: bool = True) -> list[dict[str, Any]]:
    """RunSummary dicts (docs/api.md) for `runs`, in the order given; one read of the run totals.
    Without their configs for the runs list (whose runs are loaded without them, list_runs)."""
    if not runs:
        return []
    found = session.execute(_TOTALS_OF_RUNS, {"pks": [r.id for r in runs]})
    by_run: dict[int, Mapping[str, Any]] = {row.run_pk: dict(row._mapping) for row in found}
    firsts = first_interval_sums(session, list(by_run))
    refused = refusals(session, [r.id for r in runs])
    now = datetime.now(UTC)
    return [
        _summary(run, by_run.get(run.id), firsts.get(run.id), refused.get(run.id), now, with_config) for run in runs
    ]


def run_summary(session: Session, run: Run) -> dict[str, Any]:
    return run_summaries(session, [run])[0]


# -- the runs table (GET /api/v1/runs) -------------------------------------------------------------
# Sort keys, by what the pages show. Columns of `runs` and the stored totals (records, last_step,
# and the amounts that are plain run_totals sums) sort in SQL; every other metric depends on the
# run's FLOPs coefficients, which live in the run's model JSON, so it is derived in Python over
# the filtered set: a rate from steady_sums once the run has more than one interval.
RUN_SORT_COLUMNS = ("run_id", "name", "project", "layout", "status", "started_at", "ended_at", "updated_at")
TOTALS_SORT_COLUMNS = {"records": "rows", "last_step": "last_step"} | {
    name: name for name in METRIC if name in SUM_NAMES and METRIC[name].amount
}
DERIVED_SORT_KEYS = tuple(name for name in METRIC if name not in TOTALS_SORT_COLUMNS)
SORT_KEYS = (*RUN_SORT_COLUMNS, *TOTALS_SORT_COLUMNS, *DERIVED_SORT_KEYS)
SORT_PATTERN = "^-?(" + "|".join(SORT_KEYS) + ")$"
DEFAULT_SORT = "-started_at"
# Statuses derived from a stored "running" and the time of the last contact (shown_status).
LIVE_STATUSES = ("running", "stale", "crashed")
# The layout shown and filtered: what the agent found in the batches, else what the run declared.
SHOWN_LAYOUT = func.coalesce(Run.layout_seen, Run.layout)


@dataclass(frozen=True)
class RunFilters:
    project: str | None = None
    tag: str | None = None
    layout: str | None = None
    status: str | None = None
    q: str | None = None  # free text: a substring of the name, run_id or a tag, any case
    archived: bool = False  # include archived runs
    ids: tuple[int, ...] | None = None  # only these runs (list_runs' answer to a derived status)


def _tag_elements(dialect: str) -> Any:
    """The run's tags as a table of text values, correlated to `runs`."""
    if dialect == "postgresql":
        return func.json_array_elements_text(Run.tags).table_valued("value")
    return func.json_each(Run.tags).table_valued("value")


def _where(query: Select[Any], f: RunFilters, dialect: str) -> Select[Any]:
    if not f.archived:
        query = query.where(Run.archived.is_(False))
    for column, value in ((Run.project, f.project), (SHOWN_LAYOUT, f.layout), (Run.status, f.status)):
        if value is not None:
            query = query.where(column == value)
    if f.ids is not None:
        query = query.where(Run.id.in_(f.ids))
    if f.tag is not None:
        tags = _tag_elements(dialect)
        query = query.where(exists(select(literal(1)).select_from(tags).where(tags.c.value == f.tag)))
    if f.q:
        tags = _tag_elements(dialect)
        query = query.where(
            or_(
                Run.name.icontains(f.q, autoescape=True),
                Run.run_id.icontains(f.q, autoescape=True),
                exists(select(literal(1)).select_from(tags).where(tags.c.value.icontains(f.q, autoescape=True))),
            )
        )
    return query


# The runs list never reads a run's config (up to 256 KiB each); config_values picks keys from it.
_WITHOUT_CONFIG = defer(Run.config, raiseload=True)


def config_values(session: Session, runs: Sequence[Run], keys: Sequence[str]) -> dict[int, dict[str, Any]]:
    """Per run: the values at the dotted `keys` of its config ("optimizer.name" is
    config["optimizer"]["name"]), extracted by the database; None where the run has none."""
    if not runs or not keys:
        return {}
    columns = [Run.config[tuple(key.split("."))].label(f"k{i}") for i, key in enumerate(keys)]
    rows = session.execute(select(Run.id, *columns).where(Run.id.in_([r.id for r in runs])))
    return {row[0]: dict(zip(keys, row[1:], strict=True)) for row in rows}


def list_runs(
    session: Session,
    filters: RunFilters = RunFilters(),
    sort: str = DEFAULT_SORT,
    limit: int | None = None,
    offset: int = 0,
) -> tuple[list[Run], int]:
    """One page of the runs that match `filters`, sorted by `sort` ("-" first: descending; runs
    without a value last either way; ties newest first), and how many runs match in all.

    A derived metric is sorted in Python: one query reads the filtered runs' model, hardware and
    totals (not their config), then the metric is derived per run (microseconds each), so the
    cost grows with the filtered set, not with its runs' lengths.
    """
    dialect = session.get_bind().dialect.name
    if filters.status in LIVE_STATUSES:
        filters = _with_live_status(session, filters, dialect)
    descending, key = sort.startswith("-"), sort.lstrip("-")
    total = session.scalar(_where(select(func.count()).select_from(Run), filters, dialect)) or 0
    newest = (Run.started_at.desc(), Run.id.desc())
    if key in DERIVED_SORT_KEYS:
        ids = _sorted_by_metric(session, _where(select(Run.id), filters, dialect), key, descending, newest)
        return _page(session, ids, offset, limit), total
    if key == "status":  # the status shown: a stored "running" may be stale or crashed by now
        columns = cast(Select[Any], select(Run.id, Run.status, Run.updated_at, Run.last_contact_at, Run.heartbeat_s))
        ids = _sorted_by_shown_status(session, _where(columns, filters, dialect).order_by(*newest), descending)
        return _page(session, ids, offset, limit), total
    query = _where(select(Run).options(_WITHOUT_CONFIG), filters, dialect)
    if key in TOTALS_SORT_COLUMNS:
        query = query.outerjoin(run_totals, run_totals.c.run_pk == Run.id)
        column: Any = run_totals.c[TOTALS_SORT_COLUMNS[key]]
    else:
        column = SHOWN_LAYOUT if key == "layout" else getattr(Run, key)
    order = (column.desc() if descending else column.asc()).nulls_last()
    query = query.order_by(order, *newest).offset(offset)
    if limit is not None:
        query = query.limit(limit)
    return list(session.scalars(query)), total


def _page(session: Session, ids: list[int], offset: int, limit: int | None) -> list[Run]:
    """The runs of one page of `ids` (sorted in Python), in that order, without their configs."""
    page = ids[offset : None if limit is None else offset + limit]
    found = {r.id: r for r in session.scalars(select(Run).options(_WITHOUT_CONFIG).where(Run.id.in_(page)))}
    return [found[i] for i in page]


def _sorted_by_shown_status(session: Session, newest_first: Select[Any], descending: bool) -> list[int]:
    """The runs of `newest_first` (id, status and the liveness columns, newest first) by the
    status the pages show (shown_status), ties newest first: like a derived metric, in Python, so
    that the time arithmetic is the same on every database."""
    now = datetime.now(UTC)
    shown = [
        (_liveness(status, updated_at, contact_at, beat, now), pk)
        for pk, status, updated_at, contact_at, beat in session.execute(newest_first)
    ]
    shown.sort(key=lambda row: row[0], reverse=descending)  # stable either way: ties stay newest first
    return [pk for _, pk in shown]


def _with_live_status(session: Session, filters: RunFilters, dialect: str) -> RunFilters:
    """`filters` with a derived status (running, stale, crashed) turned into the ids of the stored
    running runs that show it now: the time arithmetic is done here, the same on every database."""
    stored = replace(filters, status="running")
    columns = cast(Select[Any], select(Run.id, Run.updated_at, Run.last_contact_at, Run.heartbeat_s))
    query = _where(columns, stored, dialect)
    now = datetime.now(UTC)
    ids = tuple(
        pk
        for pk, updated_at, contact_at, beat in session.execute(query)
        if _liveness("running", updated_at, contact_at, beat, now) == filters.status
    )
    return replace(stored, ids=ids)


def _sorted_by_metric(
    session: Session, ids: Select[Any], key: str, descending: bool, newest: tuple[Any, ...]
) -> list[int]:
    """The ids of `ids` (in default order) sorted by the derived metric `key`, stably."""
    query = (
        select(Run.id, Run.model, Run.hardware, run_totals.c.rows, *(run_totals.c[name] for name in SUM_NAMES))
        .outerjoin(run_totals, run_totals.c.run_pk == Run.id)
        .where(Run.id.in_(ids.scalar_subquery()))
        .order_by(*newest)
    )
    found = session.execute(query).all()
    rate = not METRIC[key].amount  # amounts count the whole run, warm-up included
    firsts = first_interval_sums(session, [row.id for row in found if row.rows is not None]) if rate else {}
    keyed: list[tuple[int, float | None]] = []
    for row in found:
        sums = dict(row._mapping)
        if sums["rows"] is None:  # no totals yet
            keyed.append((row.id, None))
            continue
        shown = steady_sums(sums, firsts.get(row.id)) or {name: float(sums[name]) for name in SUM_NAMES}
        c = Coefficients.for_run(row.model, row.hardware)
        keyed.append((row.id, derive(shown, c)[key]))  # every metric: remembered for the page's summaries
    with_value = [(i, v) for i, v in keyed if v is not None]
    with_value.sort(key=lambda item: item[1], reverse=descending)  # stable: ties stay newest first
    return [i for i, _ in with_value] + [i for i, v in keyed if v is None]


def facets(session: Session, archived: bool = False) -> dict[str, list[dict[str, Any]]]:
    """The distinct projects and tags of the runs (archived ones only when asked), each with how
    many runs carry it, by value: what the runs table's filter menus offer."""
    dialect = session.get_bind().dialect.name
    shown = [] if archived else [Run.archived.is_(False)]
    projects = session.execute(
        select(Run.project, func.count())
        .where(Run.project.is_not(None), *shown)
        .group_by(Run.project)
        .order_by(Run.project)
    )
    tags = _tag_elements(dialect)
    tagged = session.execute(
        select(tags.c.value, func.count(distinct(Run.id)))
        .select_from(Run)
        .join(tags, true())
        .where(*shown)
        .group_by(tags.c.value)
        .order_by(tags.c.value)
    )
    return {
        "projects": [{"value": value, "runs": int(n)} for value, n in projects],
        "tags": [{"value": value, "runs": int(n)} for value, n in tagged],
    }


def find_runs(session: Session, run_ids: Sequence[str]) -> tuple[list[Run], list[str]]:
    """The runs asked for, in the order asked, and the ids that are not stored."""
    found = {r.run_id: r for r in session.scalars(select(Run).where(Run.run_id.in_(run_ids)))}
    return [found[i] for i in run_ids if i in found], [i for i in run_ids if i not in found]


def recent_step_times(session: Session, run: Run, window: int) -> list[float]:
    """Seconds per step of the run's last `window` intervals: one value per interval, its ranks'
    GPU time over their steps (every rank sends its own record; N near-equal values per interval
    would make the test's p-values falsely small). The first interval (warm-up) is left out once
    there is a second, as in RunSummary.steady."""
    first = session.scalar(select(func.min(intervals.c.interval)).where(intervals.c.run_pk == run.id))
    rows = session.execute(
        select(intervals.c.interval, func.sum(intervals.c.gpu_time_s), func.sum(intervals.c.steps))
        .where(intervals.c.run_pk == run.id)
        .group_by(intervals.c.interval)
        .order_by(intervals.c.interval.desc())
        .limit(window)
    ).all()
    if len(rows) > 1 and rows[-1][0] == first:  # the window reaches back to the warm-up
        rows = rows[:-1]
    step_time = METRIC["step_time_s"].formula
    return [
        float(step_time({"gpu_time_s": float(seconds), "rank_steps": float(steps)}, coefficients(run), FLOAT_OPS))
        for _, seconds, steps in rows
    ]


def step_time_tests(session: Session, runs: Sequence[Run], window: int) -> list[dict[str, Any]]:
    """Each run after the first against the first: is its step time really different?"""
    if len(runs) < 2:
        return []
    baseline = recent_step_times(session, runs[0], window)
    out = []
    for run in runs[1:]:
        times = recent_step_times(session, run, window)
        test = mann_whitney_u(times, baseline)
        out.append(
            {
                "run_id": run.run_id,
                "baseline_run_id": runs[0].run_id,
                "window": window,
                "n": len(times),
                "n_baseline": len(baseline),
                "median_step_s": statistics.median(times) if times else None,
                "median_step_s_baseline": statistics.median(baseline) if baseline else None,
                "p_value": None if test is None else test["p_value"],
            }
        )
    return out


# -- histograms and sync sites --------------------------------------------------------------------
def histograms(session: Session, run: Run, interval: int | None = None) -> dict[str, Any] | None:
    """An interval's length histograms summed over the ranks that sent it; None if not stored."""
    if interval is None:
        interval = session.scalar(select(run_totals.c.last_interval).where(run_totals.c.run_pk == run.id))
        if interval is None:
            return None
    query = (
        select(intervals.c.first_step, intervals.c.last_step, interval_details.c.histograms)
        .join(interval_details, interval_details.c.interval_id == intervals.c.id)
        .where(intervals.c.run_pk == run.id, intervals.c.interval == interval)
    )
    ranks = session.execute(query).all()
    if not ranks:
        return None
    out: dict[str, Any] = {
        "interval": interval,
        "first_step": int(min(r.first_step for r in ranks)),
        "last_step": int(max(r.last_step for r in ranks)),
        "edges": EDGES,
    }
    for kind in KINDS:
        out[kind] = {
            part: [sum(r.histograms[kind][part][b] for r in ranks) for b in range(NUM_BUCKETS)]
            for part in ("count", "tokens")
        }
    return out


def histogram_columns(session: Session, run: Run, columns: int) -> dict[str, Any] | None:
    """The length histograms of at most `columns` intervals spread evenly over the run (first and
    last included), each summed over its ranks: a heatmap's columns without reading every
    interval's JSON. None before the first interval."""
    last = session.scalar(select(run_totals.c.last_interval).where(run_totals.c.run_pk == run.id))
    first = session.scalar(
        select(intervals.c.interval).where(intervals.c.run_pk == run.id).order_by(intervals.c.interval).limit(1)
    )
    if last is None or first is None:
        return None
    wanted = sorted({round(x) for x in np.linspace(first, last, min(columns, last - first + 1)).tolist()})
    query = (
        select(intervals.c.interval, intervals.c.first_step, intervals.c.last_step, interval_details.c.histograms)
        .join(interval_details, interval_details.c.interval_id == intervals.c.id)
        .where(intervals.c.run_pk == run.id, intervals.c.interval.in_(wanted))
        .order_by(intervals.c.interval)
    )
    picked: dict[int, dict[str, Any]] = {}
    for interval, first_step, last_step, stored in session.execute(query):
        column = picked.setdefault(
            interval,
            {
                "first_step": first_step,
                "last_step": last_step,
                **{kind: {"count": [0] * NUM_BUCKETS, "tokens": [0] * NUM_BUCKETS} for kind in KINDS},
            },
        )
        column["first_step"] = min(column["first_step"], first_step)
        column["last_step"] = max(column["last_step"], last_step)
        for kind in KINDS:
            for part in ("count", "tokens"):
                column[kind][part] = [a + b for a, b in zip(column[kind][part], stored[kind][part], strict=True)]
    shown = sorted(picked)
    return {
        "first_interval": first,
        "last_interval": last,
        "intervals": shown,
        "first_step": [int(picked[i]["first_step"]) for i in shown],
        "last_step": [int(picked[i]["last_step"]) for i in shown],
        "edges": EDGES,
        **{kind: {part: [picked[i][kind][part] for i in shown] for part in ("count", "tokens")} for kind in KINDS},
    }


def _first_step(run_pk: Any) -> Any:
    """The run's first stored step, as first_interval_sums gives it (the least first_step of its
    first interval's rows), as a scalar subquery: one seek on the unique (run_pk, interval, rank)
    index."""
    lowest = select(func.min(intervals.c.interval)).where(intervals.c.run_pk == run_pk).scalar_subquery()
    return (
        select(func.min(intervals.c.first_step))
        .where(intervals.c.run_pk == run_pk, intervals.c.interval == lowest)
        .scalar_subquery()
    )


_SITES_TOTALS = select(
    run_totals.c.rows,
    *(run_totals.c[name] for name in SUM_NAMES),
    run_totals.c.last_step,
    _first_step(bindparam("run_pk")).label("first_step"),
).where(run_totals.c.run_pk == bindparam("run_pk"))
_RUN_SITES = select(run_sync_sites.c.site, run_sync_sites.c.count).where(run_sync_sites.c.run_pk == bindparam("run_pk"))


def sync_sites(session: Session, run: Run, limit: int, window: str = "run") -> dict[str, Any]:
    """Sync sites, most frequent first, over `window`: "run" (every interval) or "steady" (without
    the first interval, as the run's steady rates: warm-up syncs would not stand for the run), which
    is the whole run while it has a single interval. Per iteration as the catalogue's syncs_per_iter
    is, from the window's sums (one rank's syncs per step whose syncs were counted), a site's count
    in place of all syncs. The answer says which steps it covers and what share of them the agent
    counted."""
    totals = session.execute(_SITES_TOTALS, {"run_pk": run.id}).first()
    if totals is None:
        return {
            "syncs_per_iter": None,
            "sites": [],
            "window": window,
            "first_step": None,
            "last_step": None,
            "counted_share": None,
        }
    # The first interval's sums and sites only for the steady window (the whole run's needs only its first step).
    first = first_interval_sums(session, [run.id], with_sites=True).get(run.id) if window == "steady" else None
    stored = dict(totals._mapping)
    sums = steady_sums(stored, first) if window == "steady" else None
    left_out: dict[str, int] = {}
    first_step = None if totals.first_step is None else int(totals.first_step)
    if sums is not None and first is not None:
        left_out = first.sync_sites
        first_step = first.last_step + 1
    else:
        window = "run"
        sums = {name: float(stored[name]) for name in SUM_NAMES}
    c = coefficients(run)

    def per_iter(count: float) -> float | None:
        value = METRIC["syncs_per_iter"].formula({**sums, "syncs_total": count}, c, FLOAT_OPS)
        return value if math.isfinite(value) else None

    counts = {
        site: int(count) - left_out.get(site, 0) for site, count in session.execute(_RUN_SITES, {"run_pk": run.id})
    }
    ranked = sorted(((site, n) for site, n in counts.items() if n > 0), key=lambda item: (-item[1], item[0]))
    steps = sums["rank_steps"]
    return {
        "syncs_per_iter": per_iter(sums["syncs_total"]),
        "sites": [{"site": site, "count": n, "per_iter": per_iter(float(n))} for site, n in ranked[:limit]],
        "window": window,
        "first_step": first_step,
        "last_step": int(totals.last_step),
        "counted_share": sync_counted_steps(sums) / steps if steps else None,
    }


# -- live stream and CSV --------------------------------------------------------------------------
def stream_state(session: Session, run: Run) -> tuple[int, int | None, int | None]:
    """(stored rows, latest interval, latest step): the stream sends an event when this changes."""
    totals = session.execute(
        select(run_totals.c.rows, run_totals.c.last_interval, run_totals.c.last_step).where(
            run_totals.c.run_pk == run.id
        )
    ).first()
    if totals is None:
        return 0, None, None
    return int(totals.rows), int(totals.last_interval), int(totals.last_step)
