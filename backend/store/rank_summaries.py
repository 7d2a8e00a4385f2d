"""Per-interval summaries of the ranks' step times, kept at ingest: what the ranks panel reads
instead of every rank's row, so that it costs the same at 8 and at 16,384 ranks (issue 39).

For the new interval rows of a batch (each rank's step time is its row's GPU time ÷ steps):
* `rank_summaries`: per interval, the ranks reporting, Σ, least and greatest step time, last step;
* `rank_time_buckets`: per interval and bucket of log2(step time) (BUCKETS_PER_OCTAVE to an
  octave), the ranks in it and their least and greatest time, from which quantiles are read;
* `rank_slowest`: the SLOWEST_KEPT slowest ranks of each interval (the lowest rank first among
  equal times).

The first two are upserts that add or widen (written with the batch's other aggregates,
store/aggregates.py: on PostgreSQL in their one statement), so they commute: records of one
interval may come in any order, in any batches, from any server process, and the stored row is
the same. The
slowest ranks are kept by an insert that skips a row which SLOWEST_KEPT stored rows already beat,
then a delete of the rows that SLOWEST_KEPT others beat: neither can drop one of the true slowest
(a row beaten by rows that exist is beaten in the whole interval too), so concurrent writers at
worst leave a few extra rows for a moment, which the reads cut (reads/ranks.py). Only rows new to
the database come here (ingest/batches.py), so a replayed record adds nothing.
"""

import functools
import math
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection

from packscope.backend.store.db import run_sql
from packscope.backend.store.models import COLUMN_AT
from packscope.backend.store.writes import driver_of

BUCKETS_PER_OCTAVE = 256  # a bucket spans 0.27 %: a quantile read from one is that close
SLOWEST_KEPT = 8
ZERO_BUCKET = -(2**31)  # a step time of 0 (no GPU time): below every positive time's bucket

_INTERVAL, _RANK, _LAST_STEP = COLUMN_AT["interval"], COLUMN_AT["rank"], COLUMN_AT["last_step"]
_GPU_TIME, _STEPS = COLUMN_AT["gpu_time_s"], COLUMN_AT["steps"]


def bucket_of(step_time: float) -> int:
    """The bucket of a step time (>= 0): floor(log2(t) · BUCKETS_PER_OCTAVE). Migration 0016's
    backfill has its own copy of this line (migrations are frozen)."""
    return math.floor(math.log2(step_time) * BUCKETS_PER_OCTAVE) if step_time > 0 else ZERO_BUCKET


def step_time_of(row: Sequence[Any]) -> float:
    """A row's step time, as the catalogue's step_time_s of that row alone (its steps are >= 1)."""
    return float(row[_GPU_TIME]) / float(row[_STEPS])


def beats(a: tuple[float, int], b: tuple[float, int]) -> bool:
    """(step time, rank) a is slower than b: a longer time, or the lower rank of equal times."""
    return a[0] > b[0] or (a[0] == b[0] and a[1] < b[1])


Summaries = tuple[list[tuple[Any, ...]], list[tuple[Any, ...]], list[tuple[Any, ...]]]


def summarise(run_pk: int, rows: Sequence[Sequence[Any]]) -> Summaries:
    """(rank_summaries rows, rank_time_buckets rows, rank_slowest candidates) that the interval
    rows (ROW_COLUMNS tuples) add, each in key order; the candidates are each interval's
    SLOWEST_KEPT slowest of these rows, slowest first."""
    per_interval: dict[int, list[Any]] = {}
    buckets: dict[tuple[int, int], list[Any]] = {}
    times: dict[int, list[tuple[float, int]]] = {}
    for row in rows:
        interval, t = int(row[_INTERVAL]), step_time_of(row)
        last_step = int(row[_LAST_STEP])
        kept = per_interval.get(interval)
        if kept is None:
            per_interval[interval] = [1, last_step, t, t, t]
        else:
            kept[0] += 1
            kept[1] = max(kept[1], last_step)
            kept[2] += t
            kept[3] = min(kept[3], t)
            kept[4] = max(kept[4], t)
        key = (interval, bucket_of(t))
        counted = buckets.get(key)
        if counted is None:
            buckets[key] = [1, t, t]
        else:
            counted[0] += 1
            counted[1] = min(counted[1], t)
            counted[2] = max(counted[2], t)
        times.setdefault(interval, []).append((t, int(row[_RANK])))
    summaries = [(run_pk, i, *per_interval[i]) for i in sorted(per_interval)]
    bucket_rows = [(run_pk, i, b, *buckets[i, b]) for i, b in sorted(buckets)]
    candidates = []
    for i in sorted(times):
        slowest = sorted(times[i], key=lambda tr: (-tr[0], tr[1]))[:SLOWEST_KEPT]
        candidates += [(run_pk, i, rank, t) for t, rank in slowest]
    return summaries, bucket_rows, candidates


# -- the statements, in each driver's own SQL ------------------------------------------------------
def _placeholder(database: str) -> str:
    return "?" if database == "sqlite" else "%s"


# How many of an interval's stored rows beat the row (run_pk, interval, rank, step_time_s) named `s`.
_BEATEN_BY = (
    "(SELECT count(*) FROM rank_slowest b WHERE b.run_pk = {s}.run_pk AND b.interval = {s}.interval"
    " AND (b.step_time_s > {s}.step_time_s OR (b.step_time_s = {s}.step_time_s AND b.rank < {s}.rank)))"
)


@functools.cache
def _keep_if_slow(database: str) -> str:
    """Insert a candidate unless SLOWEST_KEPT stored rows of its interval beat it."""
    p = _placeholder(database)
    typed = "" if database == "sqlite" else "::integer"
    new = (
        f"SELECT {p}{typed} AS run_pk, {p}{typed} AS interval, {p}{typed} AS rank,"
        f" {p}{'' if database == 'sqlite' else '::float8'} AS step_time_s"
    )
    return (
        "INSERT INTO rank_slowest (run_pk, interval, rank, step_time_s) "
        f"SELECT n.run_pk, n.interval, n.rank, n.step_time_s FROM ({new}) AS n "
        f"WHERE {_BEATEN_BY.format(s='n')} < {SLOWEST_KEPT} "
        "ON CONFLICT DO NOTHING"
    )


@functools.cache
def _trim(database: str) -> str:
    """Delete the rows of an interval that SLOWEST_KEPT of its stored rows beat."""
    p = _placeholder(database)
    return (
        f"DELETE FROM rank_slowest WHERE run_pk = {p} AND interval = {p} "
        f"AND {_BEATEN_BY.format(s='rank_slowest')} >= {SLOWEST_KEPT}"
    )


def rank_writes(run_pk: int, rows: Sequence[Sequence[Any]]) -> tuple[list[tuple[str, list[Any]]], list[Any]]:
    """(the adding upserts of the rank summaries and buckets, as store/aggregates.py writes them
    with the batch's other aggregates; the slowest-rank candidates, for keep_slowest)."""
    summaries, buckets, candidates = summarise(run_pk, rows)
    return [("rank_summaries", summaries), ("rank_time_buckets", buckets)], candidates


def keep_slowest(connection: Connection, run_pk: int, candidates: Sequence[Sequence[Any]]) -> None:
    """Insert the candidates that SLOWEST_KEPT stored rows do not beat, then delete what they push
    out, in the batch's transaction, after its other aggregates (the run totals' row lock orders
    a run's batches)."""
    if not candidates:
        return
    database = driver_of(connection)
    if len(candidates) == 1:  # a rank's own record: no trim where it was not kept (most ranks of a wide run)
        if not run_sql(connection, _keep_if_slow(database) + " RETURNING rank", candidates[0]):
            return
    else:
        run_sql(connection, _keep_if_slow(database), candidates, many=True)
    touched = sorted({c[1] for c in candidates})
    run_sql(connection, _trim(database), [(run_pk, interval) for interval in touched], many=True)
