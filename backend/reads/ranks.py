"""The per-rank view of a run: each rank's step time over a strided sample of intervals, and per
interval the slowest rank, the median and the spread (slowest ÷ median), the straggler sign.

Every rank stores its own row per interval, so this reads raw rows, not rollups: at most
max_points intervals x ranks rows, picked by index on (run_pk, interval, rank). The interval range
of a step range is found by index seeks (series.interval_range), so the cost does not grow with
the run's length.
"""

import statistics
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from packscope.backend.reads.series import _interval_range as interval_range
from packscope.backend.store.models import Run, intervals
from packscope.backend.store.runs import coefficients
from packscope.core.catalogue import FLOAT_OPS, METRIC, RowSums


def strided(first: int, last: int, max_points: int) -> list[int]:
    """Up to max_points interval indexes spread evenly over [first, last], both ends included."""
    n = last - first + 1
    if n <= max_points:
        return list(range(first, last + 1))
    if max_points == 1:
        return [last]
    return sorted({first + round(k * (n - 1) / (max_points - 1)) for k in range(max_points)})


def rank_step_times(
    session: Session, run: Run, max_points: int, step_min: int | None = None, step_max: int | None = None
) -> dict[str, Any]:
    span = interval_range(session, run, step_min, step_max)
    wanted = strided(*span, max_points) if span else []
    rows = (
        session.execute(
            select(
                intervals.c.interval, intervals.c.rank, intervals.c.last_step, intervals.c.gpu_time_s, intervals.c.steps
            )
            .where(intervals.c.run_pk == run.id, intervals.c.interval.in_(wanted))
            .order_by(intervals.c.interval, intervals.c.rank)
        ).all()
        if wanted
        else []
    )
    per_interval: dict[int, dict[int, float]] = {}
    last_step: dict[int, int] = {}
    step_time, c = METRIC["step_time_s"].formula, coefficients(run)
    for row in rows:
        per_interval.setdefault(row.interval, {})[row.rank] = step_time(RowSums(row._asdict()), c, FLOAT_OPS)
        last_step[row.interval] = max(last_step.get(row.interval, 0), int(row.last_step))
    ranks = sorted({row.rank for row in rows})
    points = sorted(per_interval)
    out: dict[str, Any] = {
        "run_id": run.run_id, "ranks": ranks, "interval": points, "step": [last_step[i] for i in points],
        # One row per rank (a heatmap's z), None where a rank has not sent that interval (yet).
        "step_time_s": [[per_interval[i].get(r) for i in points] for r in ranks],
        "slowest_rank": [], "slowest_s": [], "median_s": [], "spread": [], "reporting_ranks": [],
    }  # fmt: skip
    for i in points:
        times = per_interval[i]
        slowest = max(times, key=lambda r: (times[r], -r))  # the lowest rank among equals
        median = statistics.median(times.values())
        out["slowest_rank"].append(slowest)
        out["slowest_s"].append(times[slowest])
        out["median_s"].append(median)
        out["spread"].append(times[slowest] / median if median > 0 else None)
        out["reporting_ranks"].append(len(times))
    return out
