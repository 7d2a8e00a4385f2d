"""The per-rank view of a run over a strided sample of intervals: per interval its slowest ranks,
the quantiles of its ranks' step times and the spread (slowest ÷ median), the straggler sign; and
each rank's step time (the rank x interval matrix) where the run has few ranks or it is asked for.

The per-interval figures come from the rank summaries kept at ingest (store/rank_summaries.py):
one summary row, a few bucket rows and SLOWEST_KEPT slowest rows per sampled interval, whatever
the number of ranks. The matrix reads raw rows, at most MATRIX_CELLS of them: all sampled
intervals of a run of up to MATRIX_RANKS ranks, fewer intervals of a larger one. The interval
range of a step range is found by index seeks (series.interval_range), so the cost does not grow
with the run's length either.
"""

import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from packscope.backend.reads.series import _interval_range as interval_range
from packscope.backend.store.models import Run, intervals, rank_slowest, rank_summaries, rank_time_buckets
from packscope.backend.store.rank_summaries import SLOWEST_KEPT
from packscope.backend.store.runs import coefficients
from packscope.core.catalogue import FLOAT_OPS, METRIC, RowSums

MATRIX_RANKS = 64  # up to this many ranks the matrix comes without asking: 64 x 200 cells
MATRIX_CELLS = 65_536  # the most cells (ranks x intervals) one answer's matrix holds


def strided(first: int, last: int, max_points: int) -> list[int]:
    """Up to max_points interval indexes spread evenly over [first, last], both ends included."""
    n = last - first + 1
    if n <= max_points:
        return list(range(first, last + 1))
    if max_points == 1:
        return [last]
    return sorted({first + round(k * (n - 1) / (max_points - 1)) for k in range(max_points)})


Buckets = Sequence[tuple[int, float, float]]  # (ranks, least, greatest) per bucket, ascending


def order_statistic(buckets: Buckets, k: int, before: int = 0) -> float:
    """The k-th smallest step time (1-based) of an interval from its buckets: exact where its
    bucket holds one value (least = greatest), else placed by its position between the bucket's
    least and greatest (both exact), which is within the bucket's width of the true value.
    `before`: the ranks in the interval's buckets below those given (a window of them)."""
    if k <= before:
        raise ValueError(f"order statistic {k} lies below the {before} values left out")
    for count, least, greatest in buckets:
        if k <= before + count:
            if count == 1 or least == greatest:
                return least
            return least + (greatest - least) * (k - before - 1) / (count - 1)
        before += count
    raise ValueError(f"order statistic {k} of {before} values")


def median(buckets: Buckets, n: int) -> float:
    """statistics.median's definition: the middle value, or the mean of the two middle ones."""
    if n % 2:
        return order_statistic(buckets, (n + 1) // 2)
    return (order_statistic(buckets, n // 2) + order_statistic(buckets, n // 2 + 1)) / 2


def quantile(buckets: Buckets, n: int, q: float) -> float:
    """The nearest-rank q-quantile: the ceil(q·n)-th smallest value."""
    return order_statistic(buckets, max(1, math.ceil(q * n)))


def _summaries(session: Session, run: Run, wanted: list[int]) -> list[Any]:
    if not wanted:
        return []
    s = rank_summaries.c
    return list(
        session.execute(
            select(s.interval, s.reporting_ranks, s.last_step, s.step_time_sum, s.step_time_min, s.step_time_max)
            .where(s.run_pk == run.id, s.interval.in_(wanted))
            .order_by(s.interval)
        ).all()
    )


def _per_interval(
    session: Session, table: Any, columns: Sequence[Any], run: Run, points: list[int]
) -> dict[int, list[Any]]:
    found: dict[int, list[Any]] = {i: [] for i in points}
    if not points:
        return found
    order = (table.c.bucket,) if table is rank_time_buckets else (table.c.step_time_s.desc(), table.c.rank)
    rows = session.execute(
        select(table.c.interval, *columns)
        .where(table.c.run_pk == run.id, table.c.interval.in_(points))
        .order_by(table.c.interval, *order)
    ).all()
    for interval, *rest in rows:
        found[interval].append(tuple(rest))
    return found


def _matrix(session: Session, run: Run, points: list[int]) -> tuple[list[int], list[list[float | None]]]:
    """(the ranks that sent any of the intervals, per rank per interval its step time or None)."""
    rows = (
        session.execute(
            select(
                intervals.c.interval, intervals.c.rank, intervals.c.last_step, intervals.c.gpu_time_s, intervals.c.steps
            )
            .where(intervals.c.run_pk == run.id, intervals.c.interval.in_(points))
            .order_by(intervals.c.interval, intervals.c.rank)
        ).all()
        if points
        else []
    )
    per_interval: dict[int, dict[int, float]] = {}
    step_time, c = METRIC["step_time_s"].formula, coefficients(run)
    for row in rows:
        per_interval.setdefault(row.interval, {})[row.rank] = step_time(RowSums(row._asdict()), c, FLOAT_OPS)
    ranks = sorted({row.rank for row in rows})
    # One row per rank (a heatmap's z), None where a rank has not sent that interval (yet).
    return ranks, [[per_interval.get(i, {}).get(r) for i in points] for r in ranks]


def rank_step_times(
    session: Session,
    run: Run,
    max_points: int,
    step_min: int | None = None,
    step_max: int | None = None,
    matrix: bool | None = None,
) -> dict[str, Any]:
    """`matrix`: None gives the matrix for runs of up to MATRIX_RANKS ranks, True for any run
    (over fewer intervals where ranks x intervals would pass MATRIX_CELLS), False never."""
    span = interval_range(session, run, step_min, step_max)
    wanted = strided(*span, max_points) if span else []
    summaries = _summaries(session, run, wanted)
    rank_count = max((int(row[1]) for row in summaries), default=0)
    with_matrix = rank_count <= MATRIX_RANKS if matrix is None else matrix
    if with_matrix and span and rank_count * len(summaries) > MATRIX_CELLS:
        summaries = _summaries(session, run, strided(*span, max(1, MATRIX_CELLS // rank_count)))
    points = [int(row[0]) for row in summaries]
    buckets = _per_interval(
        session,
        rank_time_buckets,
        (rank_time_buckets.c.ranks, rank_time_buckets.c.step_time_min, rank_time_buckets.c.step_time_max),
        run,
        points,
    )
    slowest = _per_interval(session, rank_slowest, (rank_slowest.c.rank, rank_slowest.c.step_time_s), run, points)
    out: dict[str, Any] = {
        "run_id": run.run_id, "rank_count": rank_count, "interval": points,
        "step": [int(row[2]) for row in summaries], "reporting_ranks": [int(row[1]) for row in summaries],
        "slowest_rank": [], "slowest_s": [], "median_s": [], "p90_s": [], "fastest_s": [], "mean_s": [],
        "spread": [], "slowest_ranks": [], "slowest_ranks_s": [], "matrix": with_matrix, "ranks": [], "step_time_s": [],
    }  # fmt: skip
    for interval, n, _, total, least, greatest in summaries:
        n = int(n)
        top = slowest[interval][:SLOWEST_KEPT]
        mid = median(buckets[interval], n)
        out["slowest_rank"].append(int(top[0][0]))
        out["slowest_s"].append(greatest)
        out["median_s"].append(mid)
        out["p90_s"].append(quantile(buckets[interval], n, 0.9))
        out["fastest_s"].append(least)
        out["mean_s"].append(total / n)
        out["spread"].append(greatest / mid if mid > 0 else None)
        out["slowest_ranks"].append([int(rank) for rank, _ in top])
        out["slowest_ranks_s"].append([t for _, t in top])
    if with_matrix:
        out["ranks"], out["step_time_s"] = _matrix(session, run, points)
    return out
