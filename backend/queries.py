"""Read queries. Charts aggregate in SQL, so a run of a million intervals costs the same to draw as
one of a thousand; every derived number goes through derived.metrics."""

import json
import statistics
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Select, distinct, func, select
from sqlalchemy.orm import Session

from packscope.backend.derived import interval_rate_expressions, sum_expressions
from packscope.backend.models import IntervalHistogram, IntervalSyncSite, Run, intervals
from packscope.backend.stats import mann_whitney_u
from packscope.core.catalogue import BAND_METRICS, FIELDS, METRIC, METRICS, Coefficients, derive, sums_of_rows
from packscope.core.histograms import EDGES, KINDS, NUM_BUCKETS

# The CSV: every stored column of the catalogue, then every derived metric of the interval.
CSV_RAW_COLUMNS = (*(f.name for f in FIELDS), "channel_loss")
CSV_DERIVED_COLUMNS = tuple(m.name for m in METRICS if m.name not in CSV_RAW_COLUMNS)
CSV_COLUMNS = CSV_RAW_COLUMNS + CSV_DERIVED_COLUMNS


def _utc(moment: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes (stored in UTC), PostgreSQL ones in the session's zone.
    if moment is None:
        return None
    return moment.replace(tzinfo=timezone.utc) if moment.tzinfo is None else moment.astimezone(timezone.utc)


def coefficients(run: Run) -> Coefficients:
    return Coefficients.for_run(run.model, run.hardware)


# -- runs -----------------------------------------------------------------------------------------
def get_run(session: Session, run_id: str) -> Run | None:
    return session.scalars(select(Run).where(Run.run_id == run_id)).one_or_none()


def _run_sums_query() -> Select[Any]:
    sums = [expr.label(name) for name, expr in sum_expressions(intervals.c).items()]
    return select(
        intervals.c.run_pk,
        func.count().label("intervals"),
        func.max(intervals.c.last_step).label("last_step"),
        *sums,
    ).group_by(intervals.c.run_pk)


def _summary(run: Run, sums: Mapping[str, Any] | None) -> dict[str, Any]:
    c = coefficients(run)
    totals = None if sums is None else derive(sums, c)
    return {
        "run_id": run.run_id,
        "name": run.name,
        "project": run.project,
        "tags": run.tags,
        "layout": run.layout,
        "status": run.status,
        "started_at": _utc(run.started_at),
        "ended_at": _utc(run.ended_at),
        "updated_at": _utc(run.updated_at),
        "model": run.model,
        "hardware": run.hardware,
        "parallel": run.parallel,
        "config": run.config,
        "c_lin": c.c_lin,
        "c_core": c.c_core,
        "intervals": 0 if sums is None else int(sums["intervals"]),
        "last_step": None if sums is None else int(sums["last_step"]),
        "totals": totals,
    }


def run_summaries(session: Session, runs: Sequence[Run]) -> list[dict[str, Any]]:
    """RunSummary dicts (docs/api.md) for `runs`, in the order given; one aggregate query for all."""
    if not runs:
        return []
    query = _run_sums_query().where(intervals.c.run_pk.in_([r.id for r in runs]))
    by_run = {row.run_pk: dict(row._mapping) for row in session.execute(query)}
    return [_summary(run, by_run.get(run.id)) for run in runs]


def run_summary(session: Session, run: Run) -> dict[str, Any]:
    return run_summaries(session, [run])[0]


def list_runs(session: Session) -> list[Run]:
    return list(session.scalars(select(Run).order_by(Run.started_at.desc(), Run.id.desc())))


def find_runs(session: Session, run_ids: Sequence[str]) -> tuple[list[Run], list[str]]:
    """The runs asked for, in the order asked, and the ids that are not stored."""
    found = {r.run_id: r for r in session.scalars(select(Run).where(Run.run_id.in_(run_ids)))}
    return [found[i] for i in run_ids if i in found], [i for i in run_ids if i not in found]


def recent_step_times(session: Session, run: Run, window: int) -> list[float]:
    """Seconds per step of the run's last `window` intervals (one value per interval)."""
    rows = session.scalars(
        select(intervals.c.gpu_time_s / intervals.c.steps)
        .where(intervals.c.run_pk == run.id)
        .order_by(intervals.c.interval.desc(), intervals.c.rank)
        .limit(window)
    )
    return [float(x) for x in rows]


def step_time_tests(session: Session, runs: Sequence[Run], window: int) -> list[dict[str, Any]]:
    """Each run after the first against the first: is its step time really different?"""
    if len(runs) < 2:
        return []
    baseline = recent_step_times(session, runs[0], window)
    out = []
    for run in runs[1:]:
        times = recent_step_times(session, run, window)
        test = mann_whitney_u(times, baseline)
        out.append({
            "run_id": run.run_id, "baseline_run_id": runs[0].run_id, "window": window,
            "n": len(times), "n_baseline": len(baseline),
            "median_step_s": statistics.median(times) if times else None,
            "median_step_s_baseline": statistics.median(baseline) if baseline else None,
            "p_value": None if test is None else test["p_value"],
        })
    return out


# -- series ---------------------------------------------------------------------------------------
def series(
    session: Session,
    run: Run,
    max_points: int,
    step_min: int | None = None,
    step_max: int | None = None,
) -> dict[str, Any]:
    """Consecutive intervals grouped into at most `max_points` buckets, aggregated in SQL.

    Intervals are numbered 1..n by DENSE_RANK over their index (all ranks of an interval share a
    number, so they land in one bucket) and bucket = (number - 1) * max_points // n.
    """
    where = [intervals.c.run_pk == run.id]
    if step_min is not None:
        where.append(intervals.c.last_step >= step_min)
    if step_max is not None:
        where.append(intervals.c.first_step <= step_max)
    n = select(func.count(distinct(intervals.c.interval))).where(*where).scalar_subquery()
    ordinal = func.dense_rank().over(order_by=intervals.c.interval)
    rows = select(
        *intervals.c,
        ((ordinal - 1) * max_points // n).label("bucket"),
    ).where(*where).subquery()

    c = coefficients(run)
    sums = [expr.label(name) for name, expr in sum_expressions(rows.c).items()]
    bands = []
    for name, expr in interval_rate_expressions(rows.c, c).items():
        bands += [func.min(expr).label(f"{name}_min"), func.max(expr).label(f"{name}_max")]
    query = (
        select(
            func.min(rows.c.first_step).label("first_step"),
            func.max(rows.c.last_step).label("last_step"),
            *sums,
            *bands,
        )
        .group_by(rows.c.bucket)
        .order_by(rows.c.bucket)
    )

    columns: dict[str, list[Any]] = {"step": [], "first_step": [], "last_step": []}
    columns.update({name: [] for name in METRIC})
    columns.update({f"{name}_{end}": [] for name in BAND_METRICS for end in ("min", "max")})
    for row in session.execute(query).mappings():
        derived = derive(row, c)
        columns["step"].append(int(row["last_step"]))  # a bucket is drawn at its last step
        columns["first_step"].append(int(row["first_step"]))
        columns["last_step"].append(int(row["last_step"]))
        for name in METRIC:
            columns[name].append(derived[name])
        for name in BAND_METRICS:
            for end in ("min", "max"):
                value = row[f"{name}_{end}"]
                columns[f"{name}_{end}"].append(None if value is None else float(value))
    return {"run_id": run.run_id, "points": len(columns["step"]), "columns": columns}


# -- histograms and sync sites --------------------------------------------------------------------
def histograms(session: Session, run: Run, interval: int | None = None) -> dict[str, Any] | None:
    """An interval's length histograms summed over the ranks that sent it; None if not stored."""
    if interval is None:
        interval = session.scalar(select(func.max(intervals.c.interval)).where(intervals.c.run_pk == run.id))
        if interval is None:
            return None
    of_interval = (intervals.c.run_pk == run.id, intervals.c.interval == interval)
    steps = session.execute(
        select(func.min(intervals.c.first_step), func.max(intervals.c.last_step)).where(*of_interval)
    ).one()
    if steps[0] is None:
        return None
    out: dict[str, Any] = {
        "interval": interval,
        "first_step": int(steps[0]),
        "last_step": int(steps[1]),
        "edges": EDGES,
    }
    for kind in KINDS:
        out[kind] = {"count": [0] * NUM_BUCKETS, "tokens": [0] * NUM_BUCKETS}
    buckets = (
        select(
            IntervalHistogram.kind,
            IntervalHistogram.bucket,
            func.sum(IntervalHistogram.count),
            func.sum(IntervalHistogram.tokens),
        )
        .join(intervals, intervals.c.id == IntervalHistogram.interval_id)
        .where(*of_interval)
        .group_by(IntervalHistogram.kind, IntervalHistogram.bucket)
    )
    for kind, bucket, count, tokens in session.execute(buckets):
        out[kind]["count"][bucket] = int(count)
        out[kind]["tokens"][bucket] = int(tokens)
    return out


def sync_sites(session: Session, run: Run, limit: int) -> dict[str, Any]:
    """Sync sites summed over the whole run, most frequent first."""
    steps, syncs = session.execute(
        select(func.sum(intervals.c.steps), func.sum(intervals.c.syncs_total)).where(intervals.c.run_pk == run.id)
    ).one()
    steps = int(steps or 0)
    total = func.sum(IntervalSyncSite.count)
    query = (
        select(IntervalSyncSite.site, total)
        .join(intervals, intervals.c.id == IntervalSyncSite.interval_id)
        .where(intervals.c.run_pk == run.id)
        .group_by(IntervalSyncSite.site)
        .order_by(total.desc(), IntervalSyncSite.site)
        .limit(limit)
    )
    sites = [
        {"site": site, "count": int(count), "per_iter": int(count) / steps if steps else None}
        for site, count in session.execute(query)
    ]
    return {"syncs_per_iter": int(syncs) / steps if steps else None, "sites": sites}


# -- live stream and CSV --------------------------------------------------------------------------
def stream_state(session: Session, run: Run) -> tuple[int, int | None, int | None]:
    """(stored rows, latest interval, latest step): the stream sends an event when this changes."""
    count, interval, last_step = session.execute(
        select(func.count(), func.max(intervals.c.interval), func.max(intervals.c.last_step)).where(
            intervals.c.run_pk == run.id
        )
    ).one()
    return int(count), interval, None if last_step is None else int(last_step)


def _csv_value(value: Any) -> Any:
    if value is None:
        return ""
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    return value


def iter_csv_rows(session: Session, run: Run, batch: int = 2000) -> Iterator[list[Any]]:
    """Every stored interval of `run`, one row each, in CSV_COLUMNS order; streamed from the database."""
    c = coefficients(run)
    query = (
        select(*(intervals.c[name] for name in CSV_RAW_COLUMNS))
        .where(intervals.c.run_pk == run.id)
        .order_by(intervals.c.interval, intervals.c.rank)
        .execution_options(yield_per=batch)
    )
    for row in session.execute(query).mappings():
        derived = derive(sums_of_rows([row]), c, CSV_DERIVED_COLUMNS)
        yield [_csv_value(row[name]) for name in CSV_RAW_COLUMNS] + [
            _csv_value(derived[name]) for name in CSV_DERIVED_COLUMNS
        ]
