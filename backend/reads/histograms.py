"""A run's length histograms: one interval's (the bar view) and a heatmap's sampled columns."""

from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from packscope.backend.store.models import Run, interval_details, intervals, run_totals
from packscope.core.histograms import EDGES, KINDS, NUM_BUCKETS


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
