"""A run's loss ledger (GET /api/v1/runs/{run_id}/ledger, docs/ledger.md): the window's sums, its
ranks' step times per interval, its sync sites, and the terms of packscope/core/ledger.py.

The window is the run's steady part (every interval after the first, as RunSummary.steady) or
the intervals that meet a step range. The steady window's sums are the run's totals less its
first interval, both kept at ingest (as RunSummary.steady); a step range's are summed by the
database from the rows in it, each catalogue Sum from its `Sum.value` (evaluated on columns
here). The ranks are read from the rank summaries kept at ingest (store/rank_summaries.py): one
row and the slowest ranks per interval, so the answer costs the same at 8 and 16,384 ranks.
"""

import functools
from collections.abc import Callable
from typing import Any

from sqlalchemy import Float, bindparam, case, cast, func, literal, select
from sqlalchemy.orm import Session

from packscope.backend.reads.series import _interval_range as interval_range
from packscope.backend.reads.sync_sites import sync_sites
from packscope.backend.store.first_interval import first_interval_sums, steady_sums
from packscope.backend.store.models import Run, interval_details, intervals, rank_slowest, rank_summaries, run_totals
from packscope.backend.store.runs import coefficients
from packscope.core import ledger
from packscope.core.catalogue import MAX_SYNC_SITES, SUM_FIELDS, SUM_NAMES, SUMS


class _ColumnOps:
    """catalogue.Ops on SQLAlchemy column expressions (a missing reading is NULL)."""

    @staticmethod
    def ratio(num: Any, den: Any) -> Any:
        return num / func.nullif(den, 0)

    @staticmethod
    def unless_missing(reading: Any, value: Callable[[], Any]) -> Any:
        return case((reading.is_(None), literal(0.0)), else_=value())

    @staticmethod
    def if_leader(rank: Any, value: Any) -> Any:
        return case((intervals.c.rank == 0, value), else_=literal(0.0))


# Floats before any product, so that the database sums doubles, as the catalogue's sums are.
_FIELDS = {name: cast(intervals.c[name], Float) for name in SUM_FIELDS} | {"rank": intervals.c.rank}


@functools.cache
def summed_columns() -> tuple[Any, ...]:
    """The catalogue's SUMS of interval rows as SQL aggregates, each labelled with its name: the
    database adds each row's `Sum.value`, as the run's totals add them. Built once (the alerts'
    every judging round selects them): SQLAlchemy's expressions are immutable, so they are shared."""
    return tuple(func.sum(s.value(_FIELDS, _ColumnOps())).label(s.name) for s in SUMS)


_IN_WINDOW = (
    intervals.c.run_pk == bindparam("run_pk"),
    intervals.c.interval.between(bindparam("first"), bindparam("last")),
)
_WINDOW_SUMS = select(
    func.count().label("rows"),
    func.min(intervals.c.first_step).label("first_step"),
    func.max(intervals.c.last_step).label("last_step"),
    *summed_columns(),
).where(*_IN_WINDOW)
_TOTALS = select(run_totals.c.rows, run_totals.c.last_step, *(run_totals.c[name] for name in SUM_NAMES)).where(
    run_totals.c.run_pk == bindparam("run_pk")
)
# The straggler term's sums in SQL, one row per slowest rank (None: its row not kept): each interval's
# steps are its last step less the stored interval's before it (`first_step` - 1 before the run's
# first), read from the interval before the window on; each interval's slowest rank is its
# slowest kept row, the lowest rank among equals. One pass over the window's rank summaries,
# whatever the ranks (issue 39) and without a Python loop over the intervals.
_STEPS = (
    rank_summaries.c.last_step
    - func.coalesce(
        func.lag(rank_summaries.c.last_step).over(order_by=rank_summaries.c.interval), bindparam("first_step") - 1
    )
).label("steps")
_SUMMARIES = (
    select(
        rank_summaries.c.interval,
        rank_summaries.c.reporting_ranks.label("ranks"),
        _STEPS,
        rank_summaries.c.step_time_max.label("slowest"),
        (rank_summaries.c.step_time_sum / rank_summaries.c.reporting_ranks).label("mean"),
    )
    .where(
        rank_summaries.c.run_pk == bindparam("run_pk"),
        rank_summaries.c.interval.between(bindparam("first") - 1, bindparam("last")),
        rank_summaries.c.reporting_ranks > 0,
    )
    .subquery()
)
_TOP = (
    select(
        rank_slowest.c.interval,
        rank_slowest.c.rank,
        func.row_number()
        .over(
            partition_by=rank_slowest.c.interval,
            order_by=(rank_slowest.c.step_time_s.desc(), rank_slowest.c.rank),
        )
        .label("place"),
    )
    .where(
        rank_slowest.c.run_pk == bindparam("run_pk"),
        rank_slowest.c.interval.between(bindparam("first"), bindparam("last")),
    )
    .subquery()
)
_SHARED = (_SUMMARIES.c.interval >= bindparam("first"), _SUMMARIES.c.ranks >= 2, _SUMMARIES.c.steps > 0)
_RANK_WAITS = (
    select(
        _TOP.c.rank,
        func.count().label("intervals"),
        func.sum(_SUMMARIES.c.steps).label("steps"),
        func.sum(_SUMMARIES.c.steps * _SUMMARIES.c.slowest).label("slowest_s"),
        func.sum(_SUMMARIES.c.steps * _SUMMARIES.c.mean).label("mean_s"),
    )
    .select_from(_SUMMARIES.outerjoin(_TOP, (_TOP.c.interval == _SUMMARIES.c.interval) & (_TOP.c.place == 1)))
    .where(*_SHARED)
    .group_by(_TOP.c.rank)
)
_MOST_RANKS = select(func.max(rank_summaries.c.reporting_ranks)).where(
    rank_summaries.c.run_pk == bindparam("run_pk"),
    rank_summaries.c.interval.between(bindparam("first"), bindparam("last")),
)
_SITES = (
    select(interval_details.c.sync_sites)
    .join(intervals, interval_details.c.interval_id == intervals.c.id)
    .where(*_IN_WINDOW)
)


def _window_sites(session: Session, run: Run, window: str, span: tuple[int, int]) -> list[tuple[str, float]]:
    """The window's sync sites, most frequent first: the run's stored ones for the steady or whole
    run, else the rows' own (a step range: a cost that grows with the range)."""
    if window != "steps":
        found = sync_sites(session, run, MAX_SYNC_SITES, window)["sites"]
        return [(s["site"], float(s["count"])) for s in found]
    counts: dict[str, int] = {}
    for (sites,) in session.execute(_SITES, {"run_pk": run.id, "first": span[0], "last": span[1]}):
        for site, n in (sites or {}).items():
            counts[site] = counts.get(site, 0) + int(n)
    return sorted(((site, float(n)) for site, n in counts.items() if n), key=lambda item: (-item[1], item[0]))


def _rank_waits(session: Session, run: Run, span: tuple[int, int], first_step: int) -> ledger.RankWaits:
    """The window's straggler sums from the rank summaries (_RANK_WAITS)."""
    bounds = {"run_pk": run.id, "first": span[0], "last": span[1], "first_step": first_step}
    most = session.execute(_MOST_RANKS, bounds).scalar_one_or_none() or 0
    if most < 2:
        return ledger.RankWaits(int(most), 0, 0.0, 0.0, 0.0, {})
    intervals, steps, slowest_s, mean_s, waited = 0, 0.0, 0.0, 0.0, {}
    for row in session.execute(_RANK_WAITS, bounds):
        # PostgreSQL sums integers as numeric (Decimal): floats, as the sums are.
        row_slowest, row_mean = float(row.slowest_s), float(row.mean_s)
        intervals += row.intervals
        steps, slowest_s, mean_s = steps + float(row.steps), slowest_s + row_slowest, mean_s + row_mean
        if row.rank is not None:
            waited[int(row.rank)] = row_slowest - row_mean
    return ledger.RankWaits(int(most), intervals, float(steps), float(slowest_s), float(mean_s), waited)


def _window_sums(
    session: Session, run: Run, window: str, span: tuple[int, int]
) -> tuple[dict[str, float], int, int, int]:
    """(the window's sums, its rows, first step, last step): the steady window's and the whole
    run's from what ingest keeps, a step range's from its rows."""
    if window == "steps":
        row = session.execute(_WINDOW_SUMS, {"run_pk": run.id, "first": span[0], "last": span[1]}).one()
        sums = {name: float(row._mapping[name] or 0.0) for name in SUM_NAMES}
        return sums, int(row.rows), int(row.first_step), int(row.last_step)
    totals = session.execute(_TOTALS, {"run_pk": run.id}).one()
    first = first_interval_sums(session, [run.id])[run.id]
    whole = {name: float(totals._mapping[name]) for name in SUM_NAMES}
    steady = steady_sums(dict(totals._mapping), first) if window == "steady" else None
    if steady is None:
        return whole, int(totals.rows), first.first_step, int(totals.last_step)
    return steady, int(totals.rows) - first.rows, first.last_step + 1, int(totals.last_step)


def run_ledger(
    session: Session, run: Run, first_step: int | None = None, last_step: int | None = None
) -> dict[str, Any]:
    c = coefficients(run)
    layout = run.layout_seen or run.layout
    window = "steps" if first_step is not None or last_step is not None else "steady"
    span = interval_range(session, run, first_step, last_step)
    if window == "steady" and span is not None:
        if span[1] > span[0]:
            span = (span[0] + 1, span[1])  # warm-up left out, as RunSummary.steady
        else:
            window = "run"
    if span is None:
        sums, rows, steps_from, steps_to = dict.fromkeys(SUM_NAMES, 0.0), 0, None, None
    else:
        sums, rows, steps_from, steps_to = _window_sums(session, run, window, span)
    waits = ledger.NO_RANK_WAITS
    if span is not None and steps_from is not None:
        waits = _rank_waits(session, run, span, steps_from)
    sites = _window_sites(session, run, window, span) if span is not None else []
    terms = ledger.ledger_terms(sums, c, layout, waits, sites) if rows else ledger.without_intervals(c, layout)
    step_s = ledger.step_time_s(sums, c)
    outside_s = ledger.wait_s(terms, step_s)
    mfu = next((t.fraction for t in terms if t.name == "useful"), None)
    return {
        "run_id": run.run_id,
        "window": window,
        "first_step": steps_from if rows else None,
        "last_step": steps_to if rows else None,
        "layout": layout,
        "ranks": waits.most_ranks or (1 if rows else 0),
        "steps": int(sums["steps"]) if rows else None,
        "step_time_ms": None if step_s is None else step_s * 1e3,
        # The step and the measured time between steps (the data wait): what the gains are of.
        "iteration_ms": None if step_s is None else (step_s + outside_s) * 1e3,
        "gpu_hours": sums["gpu_seconds"] / 3600.0 if rows else None,
        "terms": [_shown(t, step_s, sums["gpu_seconds"], ledger.gain(t, step_s, outside_s, mfu)) for t in terms],
        "overcount": _shown(ledger.overcount_term(sums, c), None, 0.0),
        "memory": ledger.memory_headroom(sums, c, (run.hardware or {}).get("memory_bytes")),
    }


def _shown(
    term: ledger.Term, step_s: float | None, gpu_seconds: float, gain: dict[str, float | None] | None = None
) -> dict[str, Any]:
    return {
        "name": term.name,
        "label": term.label,
        **ledger.as_time(term, step_s, gpu_seconds),
        "status": term.status,
        "source": term.source,
        "fix": term.fix,
        "loss": term.loss,
        "within_step": term.within_step,
        "gain": gain,
        "detail": term.detail,
    }
