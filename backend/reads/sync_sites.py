"""A run's sync sites, most frequent first, per iteration over the whole run or its steady part."""

import math
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from packscope.backend.store.first_interval import first_interval_sums, steady_sums
from packscope.backend.store.models import Run, intervals, run_first_interval, run_sync_sites, run_totals
from packscope.backend.store.runs import coefficients
from packscope.core.catalogue import FLOAT_OPS, METRIC, SUM_NAMES, sync_counted_steps


def _first_step(run_pk: Any) -> Any:
    """The run's first stored step, as first_interval_sums gives it (the least first_step of its
    first interval's rows), as a scalar subquery: the kept first-interval row's, else (a run stored
    before migration 0016) one seek on the unique (run_pk, interval, rank) index."""
    kept = (
        select(run_first_interval.c.first_step)
        .where(run_first_interval.c.run_pk == run_pk, run_first_interval.c.rows >= 0)
        .scalar_subquery()
    )
    lowest = select(func.min(intervals.c.interval)).where(intervals.c.run_pk == run_pk).scalar_subquery()
    from_rows = (
        select(func.min(intervals.c.first_step))
        .where(intervals.c.run_pk == run_pk, intervals.c.interval == lowest)
        .scalar_subquery()
    )
    return func.coalesce(kept, from_rows)  # both databases evaluate the second only when the first is NULL


_SITES_TOTALS = select(
    run_totals.c.rows,
    *(run_totals.c[name] for name in SUM_NAMES),
    run_totals.c.last_step,
    _first_step(bindparam("run_pk")).label("first_step"),
).where(run_totals.c.run_pk == bindparam("run_pk"))
_RUN_SITES = select(run_sync_sites.c.site, run_sync_sites.c.count).where(run_sync_sites.c.run_pk == bindparam("run_pk"))


def sync_sites(session: Session, run: Run, limit: int, window: str = "run") -> dict[str, Any]:
    """Sync sites, most frequent first, over `window`: "run" (every interval) or "steady" (without
    the first interval, as the run's steady rates: warm-up syncs would not stand for the run), which
    is the whole run while it has a single interval. Per iteration as the catalogue's syncs_per_iter
    is, from the window's sums (one rank's syncs per step whose syncs were counted), a site's count
    in place of all syncs. The answer says which steps it covers and what share of them the agent
    counted."""
    totals = session.execute(_SITES_TOTALS, {"run_pk": run.id}).first()
    if totals is None:
        return {
            "syncs_per_iter": None,
            "sites": [],
            "window": window,
            "first_step": None,
            "last_step": None,
            "counted_share": None,
        }
    # The first interval's sums and sites only for the steady window (the whole run's needs only its first step).
    first = first_interval_sums(session, [run.id], with_sites=True).get(run.id) if window == "steady" else None
    stored = dict(totals._mapping)
    sums = steady_sums(stored, first) if window == "steady" else None
    left_out: dict[str, int] = {}
    first_step = None if totals.first_step is None else int(totals.first_step)
    if sums is not None and first is not None:
        left_out = first.sync_sites
        first_step = first.last_step + 1
    else:
        window = "run"
        sums = {name: float(stored[name]) for name in SUM_NAMES}
    c = coefficients(run)

    def per_iter(count: float) -> float | None:
        value = METRIC["syncs_per_iter"].formula({**sums, "syncs_total": count}, c, FLOAT_OPS)
        return value if math.isfinite(value) else None

    counts = {
        site: int(count) - left_out.get(site, 0) for site, count in session.execute(_RUN_SITES, {"run_pk": run.id})
    }
    ranked = sorted(((site, n) for site, n in counts.items() if n > 0), key=lambda item: (-item[1], item[0]))
    steps = sums["rank_steps"]
    return {
        "syncs_per_iter": per_iter(sums["syncs_total"]),
        "sites": [{"site": site, "count": n, "per_iter": per_iter(float(n))} for site, n in ranked[:limit]],
        "window": window,
        "first_step": first_step,
        "last_step": int(totals.last_step),
        "counted_share": sync_counted_steps(sums) / steps if steps else None,
    }
