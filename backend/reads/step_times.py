"""The compare page's step-time test: each run's recent step times against the first run's."""

import statistics
from collections.abc import Sequence
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from packscope.backend.reads.stats import mann_whitney_u
from packscope.backend.store.models import Run, intervals
from packscope.backend.store.runs import coefficients
from packscope.core.catalogue import FLOAT_OPS, METRIC


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
