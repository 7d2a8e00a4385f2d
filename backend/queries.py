"""Read queries. Charts aggregate in SQL, so a run of a million intervals costs the same to draw as
one of a thousand; every derived number goes through derived.metrics."""

import json
import statistics
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Select, distinct, func, select
from sqlalchemy.orm import Session

from packscope.backend.derived import (
    Coefficients,
    Sums,
    interval_rate_expressions,
    metrics,
    sum_expressions,
)
from packscope.backend.models import Interval, IntervalHistogram, IntervalSyncSite, Run
from packscope.backend.schemas import HISTOGRAM_BUCKETS
from packscope.backend.stats import mann_whitney_u

HISTOGRAM_EDGES = [1 << b for b in range(HISTOGRAM_BUCKETS)]
TOTALS_KEYS = (
    "steps", "gpu_time_s", "tokens", "real_tokens", "documents", "packs",
    "flops_bshd", "flops_thd", "flops_useful", "tflops_bshd", "tflops_thd", "tflops_useful",
    "mfu_bshd", "mfu_thd", "mfu_useful", "overcount_pct", "step_time_s", "tokens_per_s",
    "padding_pct", "syncs_per_iter",
)
RATE_BANDS = ("tflops_bshd", "tflops_thd", "tflops_useful", "step_time_s")
SERIES_METRICS = (
    "tflops_bshd", "tflops_thd", "tflops_useful", "overcount_pct", "mfu_thd",
    "step_time_s", "tokens_per_s", "syncs_per_iter", "loss", "padding_pct",
)
# The wire record's columns as stored (syncs.total and syncs.per_iteration flattened, gpu.* prefixed).
CSV_RAW_COLUMNS = (
    "interval", "rank", "first_step", "last_step", "steps", "gpus", "wall_start", "wall_end",
    "gpu_time_s", "host_time_s", "step_time_p50_s", "step_time_p90_s", "step_time_max_s",
    "timing_lag_steps", "tokens", "real_tokens", "packs", "documents",
    "seqlen_sq_sum_bshd", "seqlen_sq_sum_thd", "flops_bshd", "flops_thd", "flops_useful",
    "syncs_total", "syncs_per_iteration", "loss", "lr", "grad_norm", "channel_loss",
    "gpu_util_pct", "gpu_power_w", "gpu_sm_clock_mhz", "gpu_mem_used_bytes", "gpu_energy_j",
)
CSV_DERIVED_COLUMNS = (
    "tflops_bshd", "tflops_thd", "tflops_useful", "mfu_bshd", "mfu_thd", "mfu_useful",
    "overcount_pct", "tokens_per_s", "padding_pct",
)
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
    sums = [expr.label(name) for name, expr in sum_expressions(Interval).items()]
    return select(
        Interval.run_pk,
        func.count().label("intervals"),
        func.max(Interval.last_step).label("last_step"),
        *sums,
    ).group_by(Interval.run_pk)


def _summary(run: Run, sums: Mapping[str, Any] | None) -> dict[str, Any]:
    c = coefficients(run)
    totals = None
    if sums is not None:
        derived = metrics(Sums.from_row(sums), c)
        totals = {key: derived[key] for key in TOTALS_KEYS}
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
    query = _run_sums_query().where(Interval.run_pk.in_([r.id for r in runs]))
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
        select(Interval.gpu_time_s / Interval.steps)
        .where(Interval.run_pk == run.id)
        .order_by(Interval.interval.desc(), Interval.rank)
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
    where = [Interval.run_pk == run.id]
    if step_min is not None:
        where.append(Interval.last_step >= step_min)
    if step_max is not None:
        where.append(Interval.first_step <= step_max)
    n = select(func.count(distinct(Interval.interval))).where(*where).scalar_subquery()
    ordinal = func.dense_rank().over(order_by=Interval.interval)
    rows = select(
        *Interval.__table__.c,
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
    columns.update({name: [] for name in SERIES_METRICS})
    columns.update({f"{name}_{end}": [] for name in RATE_BANDS for end in ("min", "max")})
    for row in session.execute(query).mappings():
        derived = metrics(Sums.from_row(row), c)
        columns["step"].append(int(row["last_step"]))  # a bucket is drawn at its last step
        columns["first_step"].append(int(row["first_step"]))
        columns["last_step"].append(int(row["last_step"]))
        for name in SERIES_METRICS:
            columns[name].append(derived[name])
        for name in RATE_BANDS:
            for end in ("min", "max"):
                value = row[f"{name}_{end}"]
                columns[f"{name}_{end}"].append(None if value is None else float(value))
    return {"run_id": run.run_id, "points": len(columns["step"]), "columns": columns}


# -- histograms and sync sites --------------------------------------------------------------------
def histograms(session: Session, run: Run, interval: int | None = None) -> dict[str, Any] | None:
    """An interval's length histograms summed over the ranks that sent it; None if not stored."""
    if interval is None:
        interval = session.scalar(select(func.max(Interval.interval)).where(Interval.run_pk == run.id))
        if interval is None:
            return None
    of_interval = (Interval.run_pk == run.id, Interval.interval == interval)
    steps = session.execute(
        select(func.min(Interval.first_step), func.max(Interval.last_step)).where(*of_interval)
    ).one()
    if steps[0] is None:
        return None
    out: dict[str, Any] = {
        "interval": interval,
        "first_step": int(steps[0]),
        "last_step": int(steps[1]),
        "edges": HISTOGRAM_EDGES,
    }
    for kind in ("documents", "packs"):
        out[kind] = {"count": [0] * HISTOGRAM_BUCKETS, "tokens": [0] * HISTOGRAM_BUCKETS}
    buckets = (
        select(
            IntervalHistogram.kind,
            IntervalHistogram.bucket,
            func.sum(IntervalHistogram.count),
            func.sum(IntervalHistogram.tokens),
        )
        .join(Interval, Interval.id == IntervalHistogram.interval_id)
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
        select(func.sum(Interval.steps), func.sum(Interval.syncs_total)).where(Interval.run_pk == run.id)
    ).one()
    steps = int(steps or 0)
    total = func.sum(IntervalSyncSite.count)
    query = (
        select(IntervalSyncSite.site, total)
        .join(Interval, Interval.id == IntervalSyncSite.interval_id)
        .where(Interval.run_pk == run.id)
        .group_by(IntervalSyncSite.site)
        .order_by(total.desc(), IntervalSyncSite.site)
        .limit(limit)
    )
    sites = [
        {"site": site, "count": int(count), "per_iteration": int(count) / steps if steps else None}
        for site, count in session.execute(query)
    ]
    return {"syncs_per_iter": int(syncs) / steps if steps else None, "sites": sites}


# -- live stream and CSV --------------------------------------------------------------------------
def stream_state(session: Session, run: Run) -> tuple[int, int | None, int | None]:
    """(stored rows, latest interval, latest step): the stream sends an event when this changes."""
    count, interval, last_step = session.execute(
        select(func.count(), func.max(Interval.interval), func.max(Interval.last_step)).where(
            Interval.run_pk == run.id
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
        select(*(getattr(Interval, name) for name in CSV_RAW_COLUMNS))
        .where(Interval.run_pk == run.id)
        .order_by(Interval.interval, Interval.rank)
        .execution_options(yield_per=batch)
    )
    for row in session.execute(query).mappings():
        sums = Sums(
            steps=row["steps"],
            gpu_time_s=row["gpu_time_s"],
            gpu_seconds=row["gpu_time_s"] * row["gpus"],
            tokens=row["tokens"],
            real_tokens=row["real_tokens"],
            s2_bshd=row["seqlen_sq_sum_bshd"],
            s2_thd=row["seqlen_sq_sum_thd"],
            documents=row["documents"],
            packs=row["packs"],
            syncs=row["syncs_total"],
            loss_weighted=None,
            loss_tokens=0,
        )
        derived = metrics(sums, c)
        yield [_csv_value(row[name]) for name in CSV_RAW_COLUMNS] + [
            _csv_value(derived[name]) for name in CSV_DERIVED_COLUMNS
        ]
