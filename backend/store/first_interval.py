"""A run's first interval (warm-up: compilation, capture, the first data) and the run's sums
without it, which its steady rates are derived from."""

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from sqlalchemy import Connection, and_, bindparam, func, select
from sqlalchemy.orm import Session

from packscope.backend.store.models import (
    Run,
    interval_details,
    intervals,
    run_first_interval,
    run_first_sync_sites,
)
from packscope.core.catalogue import SUM_FIELDS, SUM_NAMES, sums_of_rows


class FirstInterval(NamedTuple):
    """A run's first interval (every rank's rows): warm-up, which the steady rates leave out."""

    rows: int
    sums: dict[str, float]
    first_step: int
    last_step: int
    sync_sites: dict[str, int]  # summed over its rows (first_interval_sums(with_sites=True), else empty)


# One min() per run, each a seek on the index (a GROUP BY would walk every row of the runs).
_FIRST_INTERVALS = select(
    Run.id, select(func.min(intervals.c.interval)).where(intervals.c.run_pk == Run.id).scalar_subquery()
).where(Run.id.in_(bindparam("pks", expanding=True)))
# Two IN lists seek the index (a row-value IN list made SQLite scan the table); the rows of
# another run's first interval that they also match are dropped after.
_FIRST_ROWS = select(
    intervals.c.run_pk,
    intervals.c.interval,
    intervals.c.first_step,
    intervals.c.last_step,
    *(intervals.c[name] for name in SUM_FIELDS),
).where(
    intervals.c.run_pk.in_(bindparam("pks", expanding=True)),
    intervals.c.interval.in_(bindparam("intervals", expanding=True)),
)
# The sites are JSON in another table: read and decoded only when asked for.
_FIRST_ROWS_WITH_SITES = _FIRST_ROWS.add_columns(interval_details.c.sync_sites).join(
    interval_details, interval_details.c.interval_id == intervals.c.id
)


_KEPT = select(run_first_interval).where(
    run_first_interval.c.run_pk.in_(bindparam("pks", expanding=True)), run_first_interval.c.rows >= 0
)
# Every run with a first-interval row, and the sites kept for that interval (none: NULL): the
# rows of an interval since replaced by a lower one are not its.
_KEPT_SITES = (
    select(run_first_interval.c.run_pk, run_first_sync_sites.c.site, run_first_sync_sites.c.count)
    .select_from(
        run_first_interval.outerjoin(
            run_first_sync_sites,
            and_(
                run_first_sync_sites.c.run_pk == run_first_interval.c.run_pk,
                run_first_sync_sites.c.interval == run_first_interval.c.interval,
            ),
        )
    )
    .where(run_first_interval.c.run_pk.in_(bindparam("pks", expanding=True)))
)


def first_interval_sums(
    session: Session | Connection, run_pks: Sequence[int], *, with_sites: bool = False
) -> dict[int, FirstInterval]:
    """Per run: its first interval's rows (every rank's) summed: their count, SUMS, steps and (with
    `with_sites`, else none) sync sites. From the rows kept at ingest (store/aggregates.py: a row
    a run and a row a site, however many ranks); for runs stored before migration 0016, the sums
    from the rows themselves on the unique (run_pk, interval, rank) index (a few rows per rank
    whatever the run's length), their sites still the kept ones (migration 0022 summed them)."""
    if not run_pks:
        return {}
    out = {
        row.run_pk: FirstInterval(
            int(row.rows), {name: float(row._mapping[name]) for name in SUM_NAMES}, int(row.first_step),
            int(row.last_step), {},
        )
        for row in session.execute(_KEPT, {"pks": list(run_pks)})
    }  # fmt: skip
    missing = [pk for pk in run_pks if pk not in out]  # no interval yet, or stored before 0016
    if missing:
        out |= _summed_rows(session, missing, with_sites=False)
    if not with_sites:
        return out
    sites = _kept_sites(session, list(out))
    unkept = [pk for pk in out if pk not in sites]  # no first-interval row: summed from the rows
    return {pk: first._replace(sync_sites=sites[pk]) for pk, first in out.items() if pk in sites} | (
        _summed_rows(session, unkept, with_sites=True) if unkept else {}
    )


def _kept_sites(session: Session | Connection, run_pks: Sequence[int]) -> dict[int, dict[str, int]]:
    """The kept first-interval sites of each run that has a first-interval row."""
    out: dict[int, dict[str, int]] = {}
    if not run_pks:
        return out
    for run_pk, site, count in session.execute(_KEPT_SITES, {"pks": list(run_pks)}):
        kept = out.setdefault(run_pk, {})
        if site is not None:
            kept[site] = int(count)
    return out


def _summed_rows(
    session: Session | Connection, run_pks: Sequence[int], *, with_sites: bool
) -> dict[int, FirstInterval]:
    """first_interval_sums from the interval rows."""
    firsts = session.execute(_FIRST_INTERVALS, {"pks": list(run_pks)})
    first_of = {pk: interval for pk, interval in firsts if interval is not None}
    if not first_of:
        return {}
    query = _FIRST_ROWS_WITH_SITES if with_sites else _FIRST_ROWS
    rows: dict[int, list[Mapping[str, Any]]] = {}
    for row in session.execute(query, {"pks": list(first_of), "intervals": list(set(first_of.values()))}):
        if row.interval == first_of[row.run_pk]:
            rows.setdefault(row.run_pk, []).append(dict(row._mapping))
    out = {}
    for pk, found in rows.items():
        sites: dict[str, int] = {}
        for one in found if with_sites else ():
            for site, n in (one["sync_sites"] or {}).items():
                sites[site] = sites.get(site, 0) + int(n)
        first_step = int(min(r["first_step"] for r in found))
        last_step = int(max(r["last_step"] for r in found))
        out[pk] = FirstInterval(len(found), sums_of_rows(found), first_step, last_step, sites)
    return out


def steady_sums(totals: Mapping[str, Any], first: FirstInterval | None) -> dict[str, float] | None:
    """The run's SUMS without its first interval: what its rates are once warm-up (allocation,
    compilation, graph capture, the first data) is over. None while it has only one interval."""
    if first is None or int(totals["rows"]) <= first.rows:
        return None
    out = {}
    heads, ulp = first.sums, math.ulp  # local names: ingest runs this at every batch (metric_values.py)
    for name in SUM_NAMES:
        whole, head = float(totals[name]), float(heads[name])
        rest = whole - head
        # The stored total was summed in another order: a remainder within its rounding is 0.
        out[name] = 0.0 if abs(rest) <= 8 * ulp(max(abs(whole), abs(head))) else rest
    return out
