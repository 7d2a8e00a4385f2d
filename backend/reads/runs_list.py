"""The runs table (GET /api/v1/runs): its filters, its sort keys and one page of runs; and the
runs a comparison asks for."""

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, cast

from sqlalchemy import Select, exists, func, literal, or_, select
from sqlalchemy.orm import Session, defer

from packscope.backend.reads.liveness import liveness
from packscope.backend.store.metric_values import refresh
from packscope.backend.store.models import KEPT_METRICS, Run, alerts, run_metric_values, run_totals
from packscope.core.catalogue import METRIC, SUM_NAMES

# Sort keys, by what the pages show, all in SQL: columns of `runs`, the stored totals (records,
# last_step, and the amounts that are plain run_totals sums) and every other metric as the run's
# summary shows it (a rate from the steady sums once the run has more than one interval), kept
# in run_metric_values, which a metric sort first refreshes (store/metric_values.py).
RUN_SORT_COLUMNS = ("run_id", "name", "project", "layout", "status", "started_at", "ended_at", "updated_at")
TOTALS_SORT_COLUMNS = {"records": "rows", "last_step": "last_step"} | {
    name: name for name in METRIC if name in SUM_NAMES and METRIC[name].amount
}
DERIVED_SORT_KEYS = KEPT_METRICS
assert set(DERIVED_SORT_KEYS) == set(METRIC) - set(TOTALS_SORT_COLUMNS), "every metric sorts"
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
    alerting: bool = False  # only the runs with an open alert (docs/alerts.md)


def tag_elements(dialect: str) -> Any:
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
    if f.alerting:
        query = query.where(Run.id.in_(select(alerts.c.run_pk).where(alerts.c.resolved_at.is_(None))))
    if f.tag is not None:
        tags = tag_elements(dialect)
        query = query.where(exists(select(literal(1)).select_from(tags).where(tags.c.value == f.tag)))
    if f.q:
        tags = tag_elements(dialect)
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
    without a value last either way; ties newest first), and how many runs match in all."""
    dialect = session.get_bind().dialect.name
    descending, key = sort.startswith("-"), sort.lstrip("-")
    if key in DERIVED_SORT_KEYS:  # before the session's first read: SQLite's snapshot then sees them
        refresh(session.get_bind().engine)
    if filters.status in LIVE_STATUSES:
        filters = _with_live_status(session, filters, dialect)
    total = session.scalar(_where(select(func.count()).select_from(Run), filters, dialect)) or 0
    newest = (Run.started_at.desc(), Run.id.desc())
    if key == "status":  # the status shown: a stored "running" may be stale or crashed by now
        columns = cast(Select[Any], select(Run.id, Run.status, Run.updated_at, Run.last_contact_at, Run.heartbeat_s))
        ids = _sorted_by_shown_status(session, _where(columns, filters, dialect).order_by(*newest), descending)
        return _page(session, ids, offset, limit), total
    if key in DERIVED_SORT_KEYS:  # the page's ids first: narrow rows through the join and the sort
        column: Any = run_metric_values.c[key]
        order = (column.desc() if descending else column.asc()).nulls_last()
        kept = _where(select(Run.id), filters, dialect).outerjoin(
            run_metric_values, run_metric_values.c.run_pk == Run.id
        )
        kept = kept.order_by(order, *newest).offset(offset)
        return _page(session, list(session.scalars(kept if limit is None else kept.limit(limit))), 0, None), total
    query = _where(select(Run).options(_WITHOUT_CONFIG), filters, dialect)
    if key in TOTALS_SORT_COLUMNS:
        query = query.outerjoin(run_totals, run_totals.c.run_pk == Run.id)
        column = run_totals.c[TOTALS_SORT_COLUMNS[key]]
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
        (liveness(status, updated_at, contact_at, beat, now), pk)
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
        if liveness("running", updated_at, contact_at, beat, now) == filters.status
    )
    return replace(stored, ids=ids)


def find_runs(session: Session, run_ids: Sequence[str]) -> tuple[list[Run], list[str]]:
    """The runs asked for, in the order asked, and the ids that are not stored."""
    found = {r.run_id: r for r in session.scalars(select(Run).where(Run.run_id.in_(run_ids)))}
    return [found[i] for i in run_ids if i in found], [i for i in run_ids if i not in found]
