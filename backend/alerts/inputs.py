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
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, bindparam, func, select

from packscope.backend.alerts.rules import ONE_PER_RUN, Interval, RunFacts, Thresholds
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


# Each judged interval's sums over its ranks, kept between rounds in this process: an interval's
# rows only ever grow (a replay adds none), so the sums hold while its rank summary (the ranks that
# sent it, the sum of their step times, written in the rows' own transaction) is what it was; a
# round then adds up only the intervals that changed. Keyed by database, run row (its id and when
# it was created: a run deleted and created again is another) and interval.
_SUMS_KEPT: OrderedDict[tuple[Any, ...], tuple[tuple[int, float], float, dict[str, float]]] = OrderedDict()
SUMS_KEPT_MAX = 8192  # intervals: 38 a run for 200 runs; about 3 KB each
_SUMS_KEPT_LOCK = threading.Lock()
# Built once, not each round: its two dozen aggregates are then compiled and keyed once.
_SUMS_OF = (
    select(intervals.c.interval, func.count().label("ranks"),
           func.max(intervals.c.wall_end).label("wall_end"), *summed_columns())
    .where(intervals.c.run_pk == bindparam("run_pk"), intervals.c.interval.in_(bindparam("stale", expanding=True)))
    .group_by(intervals.c.interval)
)  # fmt: skip


def _interval_sums(
    connection: Connection, run: Mapping[str, Any], wanted: list[int], marks: Mapping[int, tuple[int, float]]
) -> dict[int, tuple[int, float, dict[str, float]]]:
    """interval -> (ranks, latest wall_end, sums over its ranks) of the wanted intervals, the
    database adding up only those whose rank summary (`marks`) changed since this process last did."""
    base = (str(connection.engine.url), run["id"], str(run["created_at"]))
    out: dict[int, tuple[int, float, dict[str, float]]] = {}
    with _SUMS_KEPT_LOCK:
        for index in wanted:
            kept = _SUMS_KEPT.get((*base, index))
            if kept is not None and kept[0] == marks.get(index):
                out[index] = (kept[0][0], kept[1], kept[2])
    stale = [i for i in wanted if i not in out]
    if stale:
        rows = connection.execute(_SUMS_OF, {"run_pk": run["id"], "stale": stale}).all()
        with _SUMS_KEPT_LOCK:
            for row in rows:
                sums = {name: float(row._mapping[name] or 0.0) for name in SUM_NAMES}
                out[row.interval] = (int(row.ranks), float(row.wall_end), sums)
                mark = marks.get(row.interval)
                if mark is not None and mark[0] == row.ranks:  # the summary and the rows agree: keep
                    _SUMS_KEPT[(*base, row.interval)] = (mark, float(row.wall_end), sums)
                    _SUMS_KEPT.move_to_end((*base, row.interval))
            while len(_SUMS_KEPT) > SUMS_KEPT_MAX:
                _SUMS_KEPT.popitem(last=False)
    return out


def read_intervals(connection: Connection, run: Mapping[str, Any], t: Thresholds) -> list[Interval]:
    """The run's first (warm-up and baseline) and latest intervals that every rank has sent: each
    one's sums over its ranks (added by the database, once per change: _interval_sums) and its
    ranks' step-time summaries (kept at ingest), so a judgement reads a few rows an interval at 8
    ranks as at 16,384. The per-rank sums and sync sites are read only where an alert that names
    them is about to open (with_rank_details). `run`: the runs row."""
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
    totals = _interval_sums(connection, run, wanted, marks)
    complete = max((ranks for ranks, _, _ in totals.values()), default=0)
    slowest = _per_interval(connection, rank_slowest, run_pk, wanted)
    buckets = _per_interval(connection, rank_time_buckets, run_pk, wanted)
    diverged = _diverged(connection, run_pk, wanted)
    out = []
    for index, (ranks, wall_end, sums) in sorted(totals.items()):
        if ranks < complete:
            continue  # its other ranks' rows are on their way
        kept = tuple(slowest.get(index, ()))[:SLOWEST_KEPT]  # cut what concurrent writers left over
        out.append(
            Interval(index, wall_end, sums, ranks, kept, _mean(marks.get(index)), tuple(buckets.get(index, ())),
                     nonfinite_loss=index in diverged)
        )  # fmt: skip
    return out


def _mean(mark: tuple[int, float] | None) -> float | None:
    """An interval's mean step time over its ranks from its rank summary (reporting ranks, Σ)."""
    return None if mark is None or mark[0] < 1 else mark[1] / mark[0]


def _per_interval(connection: Connection, table: Any, run_pk: int, wanted: list[int]) -> dict[int, list[Any]]:
    """rank_slowest's (rank, step time), slowest first and the lowest rank among equals, or
    rank_time_buckets' (ranks, least, greatest) in bucket order, of each wanted interval."""
    if table is rank_slowest:
        columns: tuple[Any, ...] = (table.c.rank, table.c.step_time_s)
        order: tuple[Any, ...] = (table.c.step_time_s.desc(), table.c.rank)
    else:
        columns, order = (table.c.ranks, table.c.step_time_min, table.c.step_time_max), (table.c.bucket,)
    found: dict[int, list[Any]] = {}
    rows = connection.execute(
        select(table.c.interval, *columns)
        .where(table.c.run_pk == run_pk, table.c.interval.in_(wanted))
        .order_by(table.c.interval, *order)
    )
    for interval, *rest in rows:
        found.setdefault(interval, []).append((int(rest[0]), float(rest[1]), *(float(x) for x in rest[2:])))
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
