"""A run's loss ledger (GET /api/v1/runs/{run_id}/ledger, docs/ledger.md): the window's sums per
rank in one GROUP BY, its sync sites, and the terms of backend/formulas/ledger.py.

The window is the run's steady part (every interval after the first, as RunSummary.steady) or
the intervals that meet a step range. Each rank's sums are the catalogue's SUMS, each summed by
the database from its `Sum.value` (evaluated on columns here), so the window's sums are every
rank's added, as the run's totals are.
"""

from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Float, Row, bindparam, case, cast, func, literal, select
from sqlalchemy.orm import Session

from packscope.backend.formulas import ledger
from packscope.backend.reads.series import _interval_range as interval_range
from packscope.backend.reads.sync_sites import sync_sites
from packscope.backend.store.models import Run, interval_details, intervals
from packscope.backend.store.runs import coefficients
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


def summed_columns() -> list[Any]:
    """The catalogue's SUMS of interval rows as SQL aggregates, each labelled with its name: the
    database adds each row's `Sum.value`, as the run's totals add them."""
    return [func.sum(s.value(_FIELDS, _ColumnOps())).label(s.name) for s in SUMS]


_IN_WINDOW = (
    intervals.c.run_pk == bindparam("run_pk"),
    intervals.c.interval.between(bindparam("first"), bindparam("last")),
)
_RANK_SUMS = (
    select(
        intervals.c.rank,
        func.min(intervals.c.first_step).label("first_step"),
        func.max(intervals.c.last_step).label("last_step"),
        *summed_columns(),
    )
    .where(*_IN_WINDOW)
    .group_by(intervals.c.rank)
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
    rows: Iterable[Row[Any]] = (
        [] if span is None else session.execute(_RANK_SUMS, {"run_pk": run.id, "first": span[0], "last": span[1]})
    )
    rank_sums: dict[int, dict[str, float]] = {}
    steps_covered: list[tuple[int, int]] = []
    for row in rows:
        rank_sums[int(row.rank)] = {name: float(row._mapping[name] or 0.0) for name in SUM_NAMES}
        steps_covered.append((int(row.first_step), int(row.last_step)))
    sums = {name: sum(r[name] for r in rank_sums.values()) for name in SUM_NAMES}
    sites = _window_sites(session, run, window, span) if span is not None else []
    terms = ledger.ledger_terms(sums, c, layout, rank_sums, sites) if rank_sums else ledger.without_intervals(c, layout)
    step_s = ledger.step_time_s(sums, c)
    outside_s = ledger.wait_s(terms, step_s)
    mfu = next((t.fraction for t in terms if t.name == "useful"), None)
    return {
        "run_id": run.run_id,
        "window": window,
        "first_step": min((f for f, _ in steps_covered), default=None),
        "last_step": max((last for _, last in steps_covered), default=None),
        "layout": layout,
        "ranks": sorted(rank_sums),
        "steps": int(sums["steps"]) if rank_sums else None,
        "step_time_ms": None if step_s is None else step_s * 1e3,
        # The step and the measured time between steps (the data wait): what the gains are of.
        "iteration_ms": None if step_s is None else (step_s + outside_s) * 1e3,
        "gpu_hours": sums["gpu_seconds"] / 3600.0 if rank_sums else None,
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
