"""A run's length histograms: one interval's (the bar view) and a heatmap's sampled columns, from
the per-interval sums kept at ingest (store/histogram_sums.py)."""

from typing import Any

import numpy as np
from sqlalchemy import select
from sqlalchemy.orm import Session

from packscope.backend.store.models import Run, interval_histogram_sums, intervals, run_totals
from packscope.core.histograms import EDGES, KINDS, NUM_BUCKETS

_PARTS = ("count", "tokens")


def _as_histograms(row: Any) -> dict[str, Any]:
    """An interval_histogram_sums row as {kind: {"count": [...], "tokens": [...]}}."""
    values = row._mapping
    return {
        kind: {part: [int(values[f"{kind}_{part}_{b}"]) for b in range(NUM_BUCKETS)] for part in _PARTS}
        for kind in KINDS
    }


def histograms(session: Session, run: Run, interval: int | None = None) -> dict[str, Any] | None:
    """An interval's length histograms summed over the ranks that sent it (kept at ingest: one
    row, however many ranks); None if not stored."""
    if interval is None:
        interval = session.scalar(select(run_totals.c.last_interval).where(run_totals.c.run_pk == run.id))
        if interval is None:
            return None
    h = interval_histogram_sums.c
    row = session.execute(select(interval_histogram_sums).where(h.run_pk == run.id, h.interval == interval)).first()
    if row is None:
        return None
    return {
        "interval": interval,
        "first_step": int(row.first_step),
        "last_step": int(row.last_step),
        "edges": EDGES,
        **_as_histograms(row),
    }


def histogram_columns(session: Session, run: Run, columns: int) -> dict[str, Any] | None:
    """The length histograms of at most `columns` intervals spread evenly over the run (first and
    last included), each summed over its ranks (kept at ingest): a heatmap's columns without
    reading every interval. None before the first interval."""
    last = session.scalar(select(run_totals.c.last_interval).where(run_totals.c.run_pk == run.id))
    first = session.scalar(
        select(intervals.c.interval).where(intervals.c.run_pk == run.id).order_by(intervals.c.interval).limit(1)
    )
    if last is None or first is None:
        return None
    wanted = sorted({round(x) for x in np.linspace(first, last, min(columns, last - first + 1)).tolist()})
    h = interval_histogram_sums.c
    query = select(interval_histogram_sums).where(h.run_pk == run.id, h.interval.in_(wanted)).order_by(h.interval)
    picked = {int(row.interval): (row, _as_histograms(row)) for row in session.execute(query)}
    shown = sorted(picked)
    return {
        "first_interval": first,
        "last_interval": last,
        "intervals": shown,
        "first_step": [int(picked[i][0].first_step) for i in shown],
        "last_step": [int(picked[i][0].last_step) for i in shown],
        "edges": EDGES,
        **{kind: {part: [picked[i][1][kind][part] for i in shown] for part in _PARTS} for kind in KINDS},
    }
