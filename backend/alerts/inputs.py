"""What the rules read of one run: its facts (status shown, silence, layout, coefficients, hosts) and
the intervals of two windows, the first ones (warm-up and baseline) and the latest ones, each
interval's rows summed over its ranks with the catalogue's SUMS (a bounded read: at most
RECENT_INTERVALS + the baseline's intervals, whatever the run's length)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, select

from packscope.backend.alerts.rules import ONE_PER_RUN, Interval, RunFacts, Thresholds
from packscope.backend.reads.liveness import as_utc, liveness
from packscope.backend.store.models import Run, alerts, interval_details, intervals, nonfinite_losses
from packscope.core.catalogue import FLOAT_OPS, SUM_FIELDS, SUM_NAMES, SUMS, Coefficients

# The latest intervals read: enough for every rule's streak, also where the agent counts the
# syncs of one interval in several (its sampling) or a rank's rows arrive late.
RECENT_INTERVALS = 32
_RUNS = Run.__table__
_COLUMNS = ("interval", "rank", "wall_end", *(f for f in SUM_FIELDS if f not in ("interval", "rank", "wall_end")))


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
    """The first `first` and the last `last` interval indexes the run holds."""
    distinct = select(intervals.c.interval).where(intervals.c.run_pk == run_pk).distinct()
    head = connection.execute(distinct.order_by(intervals.c.interval).limit(first)).scalars().all()
    tail = connection.execute(distinct.order_by(intervals.c.interval.desc()).limit(last)).scalars().all()
    return sorted({*head, *tail})


def read_intervals(connection: Connection, run_pk: int, t: Thresholds) -> list[Interval]:
    """The run's first (warm-up and baseline) and latest intervals that every rank has sent."""
    wanted = _indexes(connection, run_pk, t.warmup_intervals + t.baseline_intervals, RECENT_INTERVALS)
    if not wanted:
        return []
    columns = [intervals.c[name] for name in _COLUMNS]
    rows = connection.execute(
        select(*columns, interval_details.c.sync_sites)
        .join(interval_details, interval_details.c.interval_id == intervals.c.id)
        .where(intervals.c.run_pk == run_pk, intervals.c.interval.in_(wanted))
    ).all()
    diverged = set(
        connection.execute(
            select(nonfinite_losses.c.interval).where(
                nonfinite_losses.c.run_pk == run_pk, nonfinite_losses.c.interval.in_(wanted)
            )
        ).scalars()
    )
    return assembled(rows, diverged)


def assembled(rows: Sequence[Sequence[Any]], diverged: set[int]) -> list[Interval]:
    """Rows of (_COLUMNS..., sync_sites) as Intervals; an interval missing a rank that others sent
    is left out (its other rows are on their way)."""
    by_interval: dict[int, list[dict[str, Any]]] = {}
    for row in rows:
        fields = dict(zip(_COLUMNS, row[: len(_COLUMNS)], strict=True))
        fields["sync_sites"] = row[len(_COLUMNS)]
        by_interval.setdefault(fields["interval"], []).append(fields)
    ranks = max((len(r) for r in by_interval.values()), default=0)
    out = []
    for index, members in sorted(by_interval.items()):
        if len(members) < ranks:
            continue
        rank_sums = {m["rank"]: _sums(m) for m in members}
        total = dict.fromkeys(SUM_NAMES, 0.0)
        sites: dict[str, int] = {}
        for m, sums in zip(members, rank_sums.values(), strict=True):
            for name in SUM_NAMES:
                total[name] += sums[name]
            for site, n in (m["sync_sites"] or {}).items():
                sites[site] = sites.get(site, 0) + int(n)
        wall_end = max(float(m["wall_end"]) for m in members)
        out.append(Interval(index, wall_end, total, rank_sums, sites, index in diverged))
    return out


def _sums(fields: Mapping[str, Any]) -> dict[str, float]:
    return {s.name: float(s.value(fields, FLOAT_OPS)) for s in SUMS}
