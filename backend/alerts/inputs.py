"""What the rules read of one run: its facts (status shown, silence, layout, coefficients, hosts) and
the intervals of two windows, the first ones (warm-up and baseline) and the latest ones, each
interval's rows summed over its ranks with the catalogue's SUMS and its ranks' step-time summaries
(a bounded read: at most RECENT_INTERVALS + the baseline's intervals, whatever the run's length,
and a few rows an interval, whatever its number of ranks)."""

from __future__ import annotations

import dataclasses
import math
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, func, select

from packscope.backend.alerts.rules import ONE_PER_RUN, Interval, RunFacts, Thresholds, others_median_places
from packscope.backend.reads.ledger import summed_columns
from packscope.backend.reads.liveness import as_utc, liveness
from packscope.backend.store.models import (
    Run,
    alerts,
    interval_details,
    intervals,
    nonfinite_losses,
    rank_slowest,
    rank_summaries,
    rank_time_buckets,
)
from packscope.backend.store.rank_summaries import SLOWEST_KEPT
from packscope.core.catalogue import SUM_NAMES, Coefficients

# The latest intervals read: enough for every rule's streak, also where the agent counts the
# syncs of one interval in several (its sampling) or a rank's rows arrive late.
RECENT_INTERVALS = 32
_RUNS = Run.__table__


def run_facts(run: Mapping[str, Any], now: datetime) -> RunFacts:
    """`run`: a runs row (as a mapping)."""
    shown = liveness(run["status"], run["updated_at"], run["last_contact_at"], run["heartbeat_s"], now)
    updated = as_utc(run["updated_at"])
    assert updated is not None
    hosts = (run["config"] or {}).get("hosts")  # a list by rank, where the trainer registered one
    return RunFacts(
        shown_status=shown,
        silent_s=max(0.0, (now - updated).total_seconds()),
        layout=run["layout_seen"] or run["layout"],
        coefficients=Coefficients.for_run(run["model"], run["hardware"]),
        hosts={int(r): str(h) for r, h in enumerate(hosts)} if isinstance(hosts, list) else {},
    )


def reported_through(connection: Connection, run_pk: int) -> dict[tuple[str, str], float]:
    """(rule, subject) -> the latest interval the run's alerts covered: inf while one is open, else
    the latest of the intervals a resolved one named and the one it resolved at (RunFacts.reported).
    A ONE_PER_RUN rule's alerts count under subject "", whatever their site."""
    rows = connection.execute(
        select(alerts.c.rule, alerts.c.subject, alerts.c.resolved_at, alerts.c.details).where(alerts.c.run_pk == run_pk)
    ).all()
    out: dict[tuple[str, str], float] = {}
    for rule, subject, resolved_at, details in rows:
        key = (rule, "" if rule in ONE_PER_RUN else subject)
        out[key] = max(out.get(key, -math.inf), math.inf if resolved_at is None else covered(details))
    return out


def covered(details: Any) -> float:
    """The latest interval a resolved alert's details name (-inf: none)."""
    if not isinstance(details, dict):
        return -math.inf
    named = [*(details.get("intervals") or []), details.get("interval"), details.get("resolved_through")]
    return max((float(i) for i in named if isinstance(i, int) and not isinstance(i, bool)), default=-math.inf)


def run_row(connection: Connection, run_pk: int) -> Mapping[str, Any] | None:
    found = connection.execute(select(_RUNS).where(_RUNS.c.id == run_pk)).mappings().first()
    return dict(found) if found is not None else None


def _indexes(connection: Connection, run_pk: int, first: int, last: int) -> list[int]:
    """The first `first` and the last `last` interval indexes the run holds (one rank summary row
    each: store/rank_summaries.py)."""
    held = select(rank_summaries.c.interval).where(rank_summaries.c.run_pk == run_pk)
    head = connection.execute(held.order_by(rank_summaries.c.interval).limit(first)).scalars().all()
    tail = connection.execute(held.order_by(rank_summaries.c.interval.desc()).limit(last)).scalars().all()
    return sorted({*head, *tail})


@dataclass(frozen=True)
class _Totals:
    """What a round reads of one interval over all its ranks: how many sent it, the latest wall_end,
    the catalogue's sums, and the step-time buckets around the median (_near_median), the
    `below_buckets` ranks under them left out."""

    ranks: int
    wall_end: float
    sums: dict[str, float]
    below_buckets: int = 0
    buckets: tuple[tuple[int, float, float], ...] = ()


# Each judged interval's totals, kept between rounds in this process: an interval's rows (and its
# buckets, written in their transaction) only ever grow (a replay adds none), so its totals hold
# while its rank summary (the ranks that sent it, the sum of their step times) is what it was; a
# round then reads only the intervals that changed. Keyed by database, run row (its id and when it
# was created: a run deleted and created again is another) and interval.
_KEPT: OrderedDict[tuple[Any, ...], tuple[tuple[int, float], _Totals]] = OrderedDict()
KEPT_MAX = 8192  # intervals: 38 a run for 200 runs; about 3 KB each
_KEPT_LOCK = threading.Lock()
# Built once, not each round: its two dozen aggregates are then compiled and keyed once.
_SUMS_OF = (
    select(intervals.c.interval, func.count().label("ranks"),
           func.max(intervals.c.wall_end).label("wall_end"), *summed_columns())
    .where(intervals.c.run_pk == bindparam("run_pk"), intervals.c.interval.in_(bindparam("stale", expanding=True)))
    .group_by(intervals.c.interval)
)  # fmt: skip
_BUCKETS_OF = (
    select(rank_time_buckets.c.interval, rank_time_buckets.c.ranks,
           rank_time_buckets.c.step_time_min, rank_time_buckets.c.step_time_max)
    .where(rank_time_buckets.c.run_pk == bindparam("run_pk"),
           rank_time_buckets.c.interval.in_(bindparam("stale", expanding=True)))
    .order_by(rank_time_buckets.c.interval, rank_time_buckets.c.bucket)
)  # fmt: skip


def _near_median(buckets: list[tuple[int, float, float]]) -> tuple[int, tuple[tuple[int, float, float], ...]]:
    """(the ranks in the buckets left out below, the buckets that hold the places the straggler
    rule reads: rules.others_median_places), so a kept interval is a few buckets however wide the
    spread of its ranks' times."""
    first, last = others_median_places(sum(count for count, _, _ in buckets))
    below, held, through = 0, [], 0
    for bucket in buckets:
        through += bucket[0]
        if through < first:
            below = through
        elif through - bucket[0] < last:  # its first place is at or below `last`
            held.append(bucket)
        else:
            break
    return below, tuple(held)


def _interval_totals(
    connection: Connection, run: Mapping[str, Any], wanted: list[int], marks: Mapping[int, tuple[int, float]]
) -> dict[int, _Totals]:
    """The wanted intervals' totals, the database reading only those whose rank summary (`marks`)
    changed since this process last did: a round with nothing new reads no row of them."""
    base = (str(connection.engine.url), run["id"], str(run["created_at"]))
    out: dict[int, _Totals] = {}
    with _KEPT_LOCK:
        for index in wanted:
            kept = _KEPT.get((*base, index))
            if kept is not None and kept[0] == marks.get(index):
                out[index] = kept[1]
    stale = [i for i in wanted if i not in out]
    if not stale:
        return out
    rows = connection.execute(_SUMS_OF, {"run_pk": run["id"], "stale": stale}).all()
    buckets: dict[int, list[tuple[int, float, float]]] = {}
    for index, count, least, greatest in connection.execute(_BUCKETS_OF, {"run_pk": run["id"], "stale": stale}):
        buckets.setdefault(index, []).append((int(count), float(least), float(greatest)))
    with _KEPT_LOCK:
        for row in rows:
            sums = {name: float(row._mapping[name] or 0.0) for name in SUM_NAMES}
            held = buckets.get(row.interval, [])
            totals = _Totals(int(row.ranks), float(row.wall_end), sums, *_near_median(held))
            out[row.interval] = totals
            mark = marks.get(row.interval)
            # The summary, the rows and the buckets agree (no rank's row came between the reads): keep.
            if mark is not None and mark[0] == row.ranks == sum(count for count, _, _ in held):
                _KEPT[(*base, row.interval)] = (mark, totals)
                _KEPT.move_to_end((*base, row.interval))
        while len(_KEPT) > KEPT_MAX:
            _KEPT.popitem(last=False)
    return out


def read_intervals(connection: Connection, run: Mapping[str, Any], t: Thresholds) -> list[Interval]:
    """The run's first (warm-up and baseline) and latest intervals that every rank has sent: each
    one's sums over its ranks and the step-time buckets around its median (read once per change:
    _interval_totals) and its slowest ranks (kept at ingest), so a judgement reads a few rows an
    interval at 8 ranks as at 16,384. The per-rank sums and sync sites are read only where an alert
    that names them is about to open (with_rank_details). `run`: the runs row."""
    run_pk = run["id"]
    wanted = _indexes(connection, run_pk, t.warmup_intervals + t.baseline_intervals, RECENT_INTERVALS)
    if not wanted:
        return []
    s = rank_summaries.c
    marks = {
        int(i): (int(n), float(total))
        for i, n, total in connection.execute(
            select(s.interval, s.reporting_ranks, s.step_time_sum).where(s.run_pk == run_pk, s.interval.in_(wanted))
        )
    }
    totals = _interval_totals(connection, run, wanted, marks)
    complete = max((i.ranks for i in totals.values()), default=0)
    slowest = _slowest(connection, run_pk, wanted)
    diverged = _diverged(connection, run_pk, wanted)
    out = []
    for index, i in sorted(totals.items()):
        if i.ranks < complete:
            continue  # its other ranks' rows are on their way
        kept = tuple(slowest.get(index, ()))[:SLOWEST_KEPT]  # cut what concurrent writers left over
        out.append(
            Interval(index, i.wall_end, i.sums, i.ranks, kept, _mean(marks.get(index)), i.buckets, i.below_buckets,
                     nonfinite_loss=index in diverged)
        )  # fmt: skip
    return out


def _mean(mark: tuple[int, float] | None) -> float | None:
    """An interval's mean step time over its ranks from its rank summary (reporting ranks, Σ)."""
    return None if mark is None or mark[0] < 1 else mark[1] / mark[0]


def _slowest(connection: Connection, run_pk: int, wanted: list[int]) -> dict[int, list[tuple[int, float]]]:
    """Each wanted interval's rank_slowest rows, (rank, step time), slowest first and the lowest
    rank among equals."""
    t = rank_slowest.c
    found: dict[int, list[tuple[int, float]]] = {}
    rows = connection.execute(
        select(t.interval, t.rank, t.step_time_s)
        .where(t.run_pk == run_pk, t.interval.in_(wanted))
        .order_by(t.interval, t.step_time_s.desc(), t.rank)
    )
    for interval, rank, step_time in rows:
        found.setdefault(interval, []).append((int(rank), float(step_time)))
    return found


def _diverged(connection: Connection, run_pk: int, wanted: list[int]) -> set[int]:
    return set(
        connection.execute(
            select(nonfinite_losses.c.interval).where(
                nonfinite_losses.c.run_pk == run_pk, nonfinite_losses.c.interval.in_(wanted)
            )
        ).scalars()
    )


def with_rank_details(connection: Connection, run_pk: int, read: Sequence[Interval]) -> list[Interval]:
    """`read` with each interval's sync sites, summed over every rank's row of it: read only where
    an alert that names a site opens."""
    if not read:
        return []
    rows = connection.execute(
        select(intervals.c.interval, interval_details.c.sync_sites)
        .join(interval_details, interval_details.c.interval_id == intervals.c.id)
        .where(intervals.c.run_pk == run_pk, intervals.c.interval.in_([i.interval for i in read]))
    ).all()
    sites: dict[int, dict[str, int]] = {}
    for index, found in rows:
        into = sites.setdefault(index, {})
        for site, n in (found or {}).items():
            into[site] = into.get(site, 0) + int(n)
    return [dataclasses.replace(i, sites=sites.get(i.interval, {})) for i in read]
