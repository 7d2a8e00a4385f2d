"""Each run's derived metrics as its summary shows them (rates from the steady window once the run
has one, amounts from its totals), kept in `run_metric_values` so that the runs list sorts by any
of them in SQL, with the page's LIMIT, instead of deriving every run's value per request (issue 39).

They are the catalogue's own formulas (catalogue.derive) on the run's stored sums: a cache that the
read side refreshes (refresh), never ingest, whose batches must not pay for the runs list. A row
records the run_totals `rows` it was computed from; a metric sort first recomputes the rows that
are missing, stale (the run's totals have rows since: during training, the few active runs) or
computed by other formulas (`formulas` is not formulas(), the fingerprint of today's), so the
sort is always what the raw sums derive. The server refreshes too right after migrating, so the
first sort after an upgrade does not compute every run (a migration may not import the catalogue).

A sort's check reads only the runs whose totals were written since the last refresh: run_totals
`changed` is a stamp the database's trigger sets at every write (migration 0020), and the mark
(run_metric_values_mark) the stamp below which every run was up to date at the last refresh.
The server's start checks every run (values changed by hand, an upgrade).
"""

import functools
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Connection, Engine

from packscope.backend.store.db import WRITES, run_sql
from packscope.backend.store.first_interval import FirstInterval, first_interval_sums, steady_sums
from packscope.backend.store.models import KEPT_METRICS
from packscope.backend.store.writes import driver_of
from packscope.core.audio_sums import AUDIO_RECORD_SUMS
from packscope.core.catalogue import METRIC, SUM_NAMES, Coefficients, derive
from packscope.core.vision import VISION_SUMS

_AMOUNTS = tuple(name for name in KEPT_METRICS if METRIC[name].amount)
_RATES = tuple(name for name in KEPT_METRICS if not METRIC[name].amount)


def metric_values(totals: Mapping[str, Any], first: FirstInterval | None, c: Coefficients) -> list[float | None]:
    """The run's KEPT_METRICS as its summary derives them (reads/summaries.py): amounts from the
    totals, rates from the steady sums where the run has more than its first interval; None
    where undefined."""
    sums = {name: float(totals[name]) for name in SUM_NAMES}
    steady = steady_sums(totals, first)
    if steady is None:  # one window for all: its FLOPs counted once
        return list(derive(sums, c, KEPT_METRICS).values())
    rates, amounts = derive(steady, c, _RATES), derive(sums, c, _AMOUNTS)
    return [amounts[name] if name in amounts else rates[name] for name in KEPT_METRICS]


@functools.cache
def formulas() -> str:
    """A fingerprint of the formulas: every kept metric of fixed sums under a few coefficients
    (full, windowed, chunked, vision, routed-expert and audio FLOPs; a known and an unknown peak)
    and which window each reads. A formula that changes changes it."""
    probes = [{name: 1.5 + 0.37 * k for k, name in enumerate(SUM_NAMES)}]
    probes.append({name: (0.0 if k % 3 == 0 else 2.0 + 1.1 * k) for k, name in enumerate(SUM_NAMES)})
    vision = tuple((name, 7 + k) for k, name in enumerate(VISION_SUMS))
    audio = tuple((name, 11 + k) for k, name in enumerate(AUDIO_RECORD_SUMS))
    full = Coefficients(5_000, 300, 989.0, 70, 30, c_vision=vision, c_assignment=13, c_audio=audio)
    coefficients = (full, Coefficients(4_000, 200, None))
    derived = [derive(sums, c, KEPT_METRICS) for sums in probes for c in coefficients]
    text = repr(([(name, METRIC[name].amount) for name in KEPT_METRICS], derived))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


# The run's totals and kept first interval, in one read of two primary keys. PostgreSQL hands each
# set of sums as one float8[]: psycopg's cost is per column of a result (45 sums a set).
_SUMS = {
    "sqlite": lambda table: ", ".join(f'{table}."{name}"' for name in SUM_NAMES),
    "postgresql": lambda table: "ARRAY[" + ", ".join(f'{table}."{name}"' for name in SUM_NAMES) + "]::float8[]",
}
_WIDTH = len(SUM_NAMES)


@functools.cache
def _totals_and_first(database: str, runs: int) -> str:
    p = "?" if database == "sqlite" else "%s"
    sums = _SUMS[database]
    return (
        f'SELECT t.run_pk, t."rows", f."rows", f.first_step, f.last_step, {sums("t")}, {sums("f")} '
        "FROM run_totals t LEFT JOIN run_first_interval f ON f.run_pk = t.run_pk "
        f"WHERE t.run_pk IN ({', '.join([p] * runs)})"
    )


def _read(connection: Connection, run_pks: Sequence[int]) -> list[tuple[Any, ...]]:
    """Per run with totals: (run_pk, rows, first rows, first step, last step, its totals' SUM_NAMES,
    its kept first interval's (None where it has none))."""
    database = driver_of(connection)
    found = run_sql(connection, _totals_and_first(database, len(run_pks)), tuple(run_pks))
    if database == "postgresql":
        return [(*row[:5], row[5], row[6]) for row in found]
    return [(*row[:5], row[5 : 5 + _WIDTH], row[5 + _WIDTH :]) for row in found]


@functools.cache
def _upsert(database: str) -> str:
    """Insert or replace a run's values, unless a concurrent refresh already wrote them from more
    rows (a run's rows only grow): two readers may refresh the same run at once."""
    p = "?" if database == "sqlite" else "%s"
    columns = ["run_pk", "formulas", "rows", *KEPT_METRICS]
    names = ", ".join(f'"{c}"' for c in columns)
    sets = ", ".join(f'"{c}" = excluded."{c}"' for c in columns[1:])
    values = ", ".join([p] * len(columns))
    return (
        f"INSERT INTO run_metric_values ({names}) VALUES ({values}) ON CONFLICT (run_pk) DO UPDATE SET {sets} "
        'WHERE run_metric_values."rows" <= excluded."rows"'
    )


def _value_rows(connection: Connection, run_pks: Sequence[int], coefficients: Mapping[int, Coefficients]) -> list[Any]:
    """The run_metric_values rows of these runs (those with totals), from their stored sums and
    marked with the totals' rows read with them (one statement: one snapshot)."""
    found = _read(connection, run_pks)
    unkept = [row[0] for row in found if row[2] is None or row[2] < 0]  # stored before 0016
    summed = first_interval_sums(connection, unkept) if unkept else {}
    out = []
    for pk, rows, first_rows, first_step, last_step, totals_sums, first_sums in found:
        totals = dict(zip(SUM_NAMES, totals_sums, strict=True)) | {"rows": rows}
        if first_rows is None or first_rows < 0:
            first = summed.get(pk)
        else:
            kept = dict(zip(SUM_NAMES, map(float, first_sums), strict=True))
            first = FirstInterval(int(first_rows), kept, int(first_step), int(last_step), {})
        out.append((pk, formulas(), rows, *metric_values(totals, first, coefficients[pk])))
    return out


# The runs whose values are missing, stale or of other formulas: run_totals joined on the primary
# key, narrow rows; their models and hardware are read for those alone (a scan of runs' wide rows
# cost as much again: docs/benchmarks/2026-12-06-2core-ranks.md#dev-2026-12-06-runs-sort-cache).
# {since}: every run, or (on the `changed` index) only those whose totals were written since a mark.
_STALE = (
    "SELECT t.run_pk FROM run_totals t LEFT JOIN run_metric_values v ON v.run_pk = t.run_pk "
    'WHERE v.run_pk IS NULL OR v."rows" <> t."rows" OR v.formulas <> {p} ORDER BY t.run_pk'
)
# The runs whose totals were written since the mark (on the `changed` index), each with whether
# its values are stale.
_WRITTEN_SINCE = (
    'SELECT t.run_pk, (v.run_pk IS NULL OR v."rows" <> t."rows" OR v.formulas <> {p}) FROM run_totals t '
    "LEFT JOIN run_metric_values v ON v.run_pk = t.run_pk WHERE t.changed >= {p} ORDER BY t.run_pk"
)
# Before the runs are read: the bound of this refresh's stamps (every run written with a lower
# stamp is visible to the reads that follow, models.run_totals), the stored mark, and the least
# and greatest formulas of any row (two servers of other versions at once): each one probe of the
# `formulas` index whatever the planner's statistics (a range test was planned as a scan of
# every row where the table was analysed before it was filled:
# docs/benchmarks/2026-12-06-2core-ranks.md#dev-2026-12-06-pg).
_BOUND = {
    "postgresql": "pg_snapshot_xmin(pg_current_snapshot())::text::bigint",
    "sqlite": "(SELECT coalesce(max(changed), 0) + 1 FROM run_totals)",
}
_STATE = (
    "SELECT {bound}, (SELECT changed FROM run_metric_values_mark WHERE id = 1), "
    "(SELECT min(formulas) FROM run_metric_values), (SELECT max(formulas) FROM run_metric_values)"
)
_MARK = {
    "postgresql": "INSERT INTO run_metric_values_mark (id, changed) VALUES (1, %s) "
    "ON CONFLICT (id) DO UPDATE SET changed = greatest(run_metric_values_mark.changed, excluded.changed)",
    "sqlite": "INSERT INTO run_metric_values_mark (id, changed) VALUES (1, ?) "
    "ON CONFLICT (id) DO UPDATE SET changed = max(run_metric_values_mark.changed, excluded.changed)",
}
_COEFFICIENTS = {
    "sqlite": "SELECT id, model, hardware FROM runs WHERE id IN ({})",
    "postgresql": "SELECT id, model::text, hardware::text FROM runs WHERE id IN ({})",
}
_CHUNK = 500


def _stale(connection: Connection, everything: bool) -> tuple[list[int], int, bool]:
    """The runs to recompute, the mark that holds once they are, and whether to store it. Every
    run is checked where `everything`, where no mark is stored or where some row is of other
    formulas; else only the runs whose totals were written since the mark (the `changed` index:
    O(runs changed), not O(runs)). The mark is stored after a full check, with values, or where
    some run read was up to date already (PostgreSQL's mark lagged behind a transaction still
    running at the last refresh): so the same runs are not read again at every sort."""
    database = driver_of(connection)
    p = "?" if database == "sqlite" else "%s"
    bound, mark, least, greatest = run_sql(connection, _STATE.format(bound=_BOUND[database]), ())[0]
    other = least is not None and (least != formulas() or greatest != formulas())
    if everything or mark is None or other:
        return [pk for (pk,) in run_sql(connection, _STALE.format(p=p), (formulas(),))], int(bound), True
    found = run_sql(connection, _WRITTEN_SINCE.format(p=p), (formulas(), int(mark)))
    stale = [pk for pk, is_stale in found if is_stale]
    return stale, int(bound), bool(stale) or (len(found) > 0 and int(bound) > int(mark))


def _coefficients(connection: Connection, run_pks: Sequence[int]) -> dict[int, Coefficients]:
    database = driver_of(connection)
    sql = _COEFFICIENTS[database].format(", ".join(["?" if database == "sqlite" else "%s"] * len(run_pks)))
    return {pk: Coefficients.of_json(model, hardware) for pk, model, hardware in run_sql(connection, sql, run_pks)}


def refresh(engine: Engine, everything: bool = False) -> int:
    """Compute the kept metrics of every run with totals whose values are missing, stale or of other
    formulas; how many runs that was. Only the runs whose totals were written since the stored
    mark are checked, unless `everything` (the server's start: rows changed by hand, an upgrade).
    Read in one transaction, written in a short one with the new mark (on SQLite the write lock is
    held for the upsert alone). A batch that lands in between leaves its run stale again, for the
    next refresh: each row is marked with the rows it was computed from, and the batch's stamp is
    at or above the new mark."""
    with engine.connect() as connection:
        stale, bound, store_mark = _stale(connection, everything)
        if not store_mark:  # the usual sort: two short reads, no write
            return 0
        rows = []
        for at in range(0, len(stale), _CHUNK):
            coefficients = _coefficients(connection, stale[at : at + _CHUNK])
            rows += _value_rows(connection, list(coefficients), coefficients)
    with engine.execution_options(**{WRITES: True}).begin() as connection:
        database = driver_of(connection)
        if rows:
            run_sql(connection, _upsert(database), rows, many=True)
        run_sql(connection, _MARK[database], (bound,))
    return len(stale)
