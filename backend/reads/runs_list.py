"""The runs table (GET /api/v1/runs): its filters, its sort keys and one page of runs; and the
runs a comparison asks for."""

from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, cast

import numpy as np
from sqlalchemy import Select, Text, exists, func, literal, or_, select
from sqlalchemy import cast as sql_cast
from sqlalchemy.orm import Session, defer

from packscope.backend.formulas.columns import derive_columns
from packscope.backend.formulas.sums_read import ReadSums
from packscope.backend.store.first_interval import first_interval_sums
from packscope.backend.reads.liveness import liveness
from packscope.backend.store.models import Run, alerts, run_first_interval, run_totals
from packscope.core.catalogue import FLOAT_OPS, METRIC, SUM_NAMES, Coefficients

# Sort keys, by what the pages show. Columns of `runs` and the stored totals (records, last_step,
# and the amounts that are plain run_totals sums) sort in SQL; every other metric depends on the
# run's FLOPs coefficients, which live in the run's model JSON, so it is derived here over the
# filtered set (_sorted_by_metric): a rate from the steady sums once the run has more than one interval.
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
    without a value last either way; ties newest first), and how many runs match in all.

    A derived metric is sorted here (_sorted_by_metric): the sums it reads of the filtered runs
    as numpy columns, one evaluation per distinct model, so the cost grows with the filtered set,
    not with its runs' lengths or ranks.
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


def _metric_reads(key: str, c: Coefficients) -> frozenset[str]:
    """The SUMS the metric `key` reads for a run of these coefficients."""
    reads = ReadSums(1.0)
    METRIC[key].formula(reads, c, FLOAT_OPS)
    return frozenset(reads.read)


def _steady_columns(totals: np.ndarray, first: np.ndarray, has_steady: np.ndarray) -> np.ndarray:
    """steady_sums on columns: the totals minus the first interval's sums where the run has more
    than its first interval (a remainder within the totals' rounding is 0), else the totals."""
    rest = totals - first
    rounding = 8 * np.spacing(np.maximum(np.abs(totals), np.abs(first)))
    rest = np.where(np.abs(rest) <= rounding, 0.0, rest)
    return np.where(has_steady[:, None], rest, totals)


def _sorted_by_metric(
    session: Session, ids: Select[Any], key: str, descending: bool, newest: tuple[Any, ...]
) -> list[int]:
    """The ids of `ids` (in default order) sorted by the derived metric `key`, stably: the sums it
    reads (its rate from the steady window, the totals less the first interval kept at ingest,
    where the run has one; an amount from the totals) as columns, one formula evaluation (numpy)
    per distinct model and hardware, not per run."""
    texts = (sql_cast(Run.model, Text), sql_cast(Run.hardware, Text))
    kinds = session.execute(select(*texts).where(Run.id.in_(ids.scalar_subquery())).distinct()).all()
    coefficients = {(model, hardware): Coefficients.of_json(model, hardware) for model, hardware in kinds}
    needed = sorted(set().union(*(_metric_reads(key, c) for c in coefficients.values())) or {"steps"})
    rate = not METRIC[key].amount  # amounts count the whole run, warm-up included
    f = run_first_interval.c
    query = (
        select(Run.id, *texts, run_totals.c.rows, f.rows, *(run_totals.c[n] for n in needed), *(f[n] for n in needed))
        .outerjoin(run_totals, run_totals.c.run_pk == Run.id)
        .outerjoin(run_first_interval, f.run_pk == Run.id)
        .where(Run.id.in_(ids.scalar_subquery()))
        .order_by(*newest)
    )
    found = session.execute(query).all()
    stored = [row for row in found if row[3] is not None]  # runs without totals yet sort last
    width = len(needed)
    values = np.array([row[5:] for row in stored], dtype=float).reshape(len(stored), 2 * width)
    totals, first = values[:, :width], np.nan_to_num(values[:, width:])
    rows = np.array([row[3] for row in stored], dtype=float)
    first_rows = np.array([-1 if row[4] is None else row[4] for row in stored], dtype=float)
    if rate:
        unkept = [k for k, row in enumerate(stored) if row[4] is None or row[4] < 0]  # stored before 0016
        summed = first_interval_sums(session, [stored[k][0] for k in unkept]) if unkept else {}
        for k in unkept:
            one = summed.get(stored[k][0])
            if one is not None:
                first[k], first_rows[k] = [one.sums[n] for n in needed], one.rows
        shown = _steady_columns(totals, first, (first_rows >= 0) & (rows > first_rows))
    else:
        shown = totals
    metric = np.full(len(stored), np.nan)
    index_of = {pair: at for at, pair in enumerate(coefficients)}
    group = np.array([index_of.get((row[1], row[2]), -1) for row in stored], dtype=np.int64)  # -1: a run added since
    for at, c in enumerate(coefficients.values()):
        members = group == at
        if members.any():
            columns = {n: shown[members, j] for j, n in enumerate(needed)}
            columns.setdefault("steps", np.zeros(int(members.sum())))
            metric[members] = derive_columns(columns, c, [key])[key]
    order = [(stored[k][0], float(metric[k])) for k in range(len(stored)) if not np.isnan(metric[k])]
    order.sort(key=lambda item: item[1], reverse=descending)  # stable: ties stay newest first
    ranked = {pk for pk, _ in order}
    return [pk for pk, _ in order] + [row[0] for row in found if row[0] not in ranked]


def find_runs(session: Session, run_ids: Sequence[str]) -> tuple[list[Run], list[str]]:
    """The runs asked for, in the order asked, and the ids that are not stored."""
    found = {r.run_id: r for r in session.scalars(select(Run).where(Run.run_id.in_(run_ids)))}
    return [found[i] for i in run_ids if i in found], [i for i in run_ids if i not in found]
