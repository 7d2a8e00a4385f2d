"""The write side: create/resume runs and store batches of interval records idempotently.

A batch is one transaction: the new interval rows (ON CONFLICT DO NOTHING RETURNING tells which
are new), their details, and the rollups, run totals and run sync sites that only the new rows
feed, each upserted once per touched key so a replay never double-counts.
"""

import functools
import itertools
import json
import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timezone
from typing import Any

import numpy as np
from sqlalchemy import ColumnElement, Connection, Dialect, Table, func, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from packscope.backend.columns import BAND_COLUMNS, derive_columns, merge_blocks, rows_with_nulls, sums_per_row
from packscope.backend.models import (
    ROLLUP_LEVELS,
    Run,
    interval_details,
    intervals,
    rollups,
    run_sync_sites,
    run_totals,
)
from packscope.backend.queries import coefficients, get_run
from packscope.backend.schemas import IngestResult, IntervalRecord, RunCreate, RunPatch
from packscope.core.catalogue import BAND_METRICS, FIELDS, SUM_NAMES, Coefficients


class ModelConflict(Exception):
    """A resume sent a different FLOPs model than the one stored with the run."""


def _now() -> datetime:
    return datetime.now(timezone.utc)


def create_or_resume_run(session: Session, body: RunCreate) -> tuple[Run, bool]:
    """(run, created). A resume keeps the stored run and marks it running again."""
    model = body.model.to_dict()
    run = get_run(session, body.run_id)
    if run is None:
        now = _now()
        run = Run(
            run_id=body.run_id,
            name=body.name,
            project=body.project,
            tags=body.tags,
            config=body.config,
            model=model,
            hardware=body.hardware.model_dump(),
            parallel=body.parallel,
            layout=body.layout,
            status="running",
            started_at=body.started_at or now,
            ended_at=None,
            created_at=now,
            updated_at=now,
        )
        session.add(run)
        try:
            session.commit()
            return run, True
        except IntegrityError:  # another request created it first: this one is a resume
            session.rollback()
            run = get_run(session, body.run_id)
            assert run is not None
    if run.model != model:
        changed = sorted(k for k in model if run.model.get(k) != model[k])
        raise ModelConflict(
            f"run {body.run_id!r} is stored with a different model (fields differ: "
            f"{', '.join(changed)}); the FLOPs of one run must use one model, so start a new run_id"
        )
    # A second POST means the trainer (re)started with this run_id.
    run.status, run.ended_at, run.updated_at = "running", None, _now()
    session.commit()
    return run, False


def patch_run(session: Session, run: Run, body: RunPatch) -> Run:
    now = _now()
    run.status = body.status
    run.ended_at = None if body.status == "running" else (body.ended_at or now)
    run.updated_at = now
    session.commit()
    return run


# -- rows of a batch -------------------------------------------------------------------------------
def _wire_groups() -> list[tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]], int]]:
    """(parent path, getter of its values, how many) per object of the wire record that holds
    catalogue fields: one C-level attrgetter call per object instead of a getattr per field."""
    by_parent: dict[tuple[str, ...], list[str]] = {}
    for f in FIELDS:
        by_parent.setdefault(f.wire_path[:-1], []).append(f.wire_path[-1])
    groups = []
    for parent, keys in by_parent.items():
        get = operator.attrgetter(*keys)
        groups.append((parent, get if len(keys) > 1 else (lambda obj, one=get: (one(obj),)), len(keys)))
    return groups


_WIRE_GROUPS = _wire_groups()
_WIRE_ORDER = [f.name for parent in {f.wire_path[:-1]: 0 for f in FIELDS} for f in FIELDS if f.wire_path[:-1] == parent]
# The columns of an inserted interval row: the table's, without the generated id.
ROW_COLUMNS = tuple(name for name in intervals.columns.keys() if name != "id")  # noqa: SIM118
_AT = {name: i for i, name in enumerate(ROW_COLUMNS)}
_FIELD_SLICE = slice(_AT[FIELDS[0].name], _AT[FIELDS[-1].name] + 1)  # the catalogue fields of a row
# From the fields in wire-group order (run_pk and channel_loss around them) to ROW_COLUMNS order.
_TO_ROW_ORDER = operator.itemgetter(*(("run_pk", *_WIRE_ORDER, "channel_loss").index(name) for name in ROW_COLUMNS))
Key = tuple[int, int]  # (interval, rank)


def interval_row(run_pk: int, r: IntervalRecord) -> tuple[Any, ...]:
    """The record's table row in ROW_COLUMNS order: every catalogue field, read from its place on
    the wire (None where an optional object is missing), and channel_loss as JSON text."""
    values: list[Any] = [run_pk]
    for parent, get, count in _WIRE_GROUPS:
        obj: Any = r
        for key in parent:
            obj = getattr(obj, key)
        values.extend((None,) * count if obj is None else get(obj))
    values.append(None if r.channel_loss is None else json.dumps(r.channel_loss, sort_keys=True))
    return _TO_ROW_ORDER(values)  # type: ignore[no-any-return]


def row_key(row: Sequence[Any]) -> Key:
    return row[_AT["interval"]], row[_AT["rank"]]


def sync_sites_of(r: IntervalRecord) -> dict[str, int]:
    return {s.site: s.count for s in r.syncs.sites}


# -- rollups and totals of a set of new rows, aggregated with numpy -------------------------------
def _per_row_blocks(rows: Sequence[Sequence[Any]], c: Coefficients) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(interval, int columns, float columns) of each row as its own block: its sums, and its band
    metrics as both the min and the max."""
    fields = np.array([row[_FIELD_SLICE] for row in rows], dtype=float)  # None -> NaN
    by_name = {name: fields[:, i] for i, name in enumerate(ROW_COLUMNS[_FIELD_SLICE])}
    sums = sums_per_row(by_name)
    rates = derive_columns(sums, c, BAND_METRICS)
    floats = np.column_stack([sums[n] for n in SUM_NAMES] + [rates[n.rsplit("_", 1)[0]] for n in BAND_COLUMNS])
    steps = [(1, row[_AT["first_step"]], row[_AT["last_step"]]) for row in rows]
    return np.array([row[_AT["interval"]] for row in rows], dtype=np.int64), np.array(steps, dtype=np.int64), floats


def store_aggregates(
    connection: Connection, run_pk: int, c: Coefficients, rows: Sequence[Sequence[Any]], sync_sites: Mapping[str, int]
) -> None:
    """Add new interval rows (ROW_COLUMNS tuples, sorted by interval then rank) to the run's
    rollups, totals and sync sites. Keys are written in sorted order, so concurrent batches of one
    run lock rows in the same order and cannot deadlock."""
    if not rows:
        return
    dialect_class = type(connection.dialect)
    keys, ints, floats = _per_row_blocks(rows, c)
    blocks = []
    for level in ROLLUP_LEVELS:
        keys, ints, floats = merge_blocks(keys >> 2 if level else keys, ints, floats)
        listed = zip(keys.tolist(), ints.tolist(), rows_with_nulls(floats), strict=True)
        blocks += [(run_pk, level, key, *i, *f) for key, i, f in listed]
    connection.exec_driver_sql(_upsert_adding(dialect_class, "rollups"), blocks)
    # The top level covers every new row once.
    last_interval = max(row[_AT["interval"]] for row in rows)
    sums = floats[:, : len(SUM_NAMES)].sum(axis=0).tolist()
    totals = (run_pk, int(ints[:, 0].sum()), last_interval, int(ints[:, 2].max()), *sums)
    connection.exec_driver_sql(_upsert_adding(dialect_class, "run_totals"), [totals])
    if sync_sites:
        sites = [(run_pk, site, n) for site, n in sorted(sync_sites.items())]
        connection.exec_driver_sql(_upsert_adding(dialect_class, "run_sync_sites"), sites)


# -- statements, compiled once per dialect to the driver's own SQL --------------------------------
def _insert(dialect: Dialect, table: Table) -> postgresql.Insert | sqlite.Insert:
    # ON CONFLICT has the same spelling on both backends, but lives in dialect modules.
    if dialect.name == "postgresql":
        return postgresql.insert(table)
    if dialect.name == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"unsupported database {dialect.name!r}; use SQLite or PostgreSQL")


def _positional_dialect(dialect_class: type[Dialect]) -> Dialect:
    # The paramstyles sqlite3 and psycopg take positionally.
    return dialect_class(paramstyle="qmark" if dialect_class.name == "sqlite" else "format")


def _positional(dialect: Dialect, stmt: Any, columns: Sequence[str]) -> str:
    """`stmt` as the driver's SQL with positional parameters in `columns` order: executemany with
    tuples skips SQLAlchemy's per-row parameter handling."""
    compiled = stmt.compile(dialect=dialect, column_keys=list(columns))
    assert list(compiled.positiontup) == list(columns), compiled.positiontup
    return str(compiled)


_AGGREGATE_TABLES = {t.name: t for t in (rollups, run_totals, run_sync_sites)}


@functools.cache
def _upsert_adding(dialect_class: type[Dialect], table_name: str) -> str:
    """INSERT … ON CONFLICT (primary key) DO UPDATE: counts and sums add, steps and bands widen.
    Parameters: the table's columns in order."""
    dialect = _positional_dialect(dialect_class)
    table = _AGGREGATE_TABLES[table_name]
    key = [c.name for c in table.primary_key.columns]
    stmt = _insert(dialect, table)
    least, greatest = (func.least, func.greatest) if dialect.name == "postgresql" else (func.min, func.max)

    def widen(pick: Any, stored: ColumnElement[Any], new: ColumnElement[Any]) -> ColumnElement[Any]:
        return func.coalesce(pick(stored, new), stored, new)  # SQLite's min(x, NULL) is NULL

    changes: dict[str, Any] = {}
    for column in table.columns:
        stored, new = column, stmt.excluded[column.name]
        if column.name in key:
            continue
        if column.name.endswith("_min") or column.name == "first_step":
            changes[column.name] = widen(least, stored, new)
        elif column.name.endswith("_max") or column.name in ("last_step", "last_interval"):
            changes[column.name] = widen(greatest, stored, new)
        else:
            changes[column.name] = stored + new
    return _positional(dialect, stmt.on_conflict_do_update(index_elements=key, set_=changes), table.columns.keys())


@functools.cache
def _insert_new_intervals(dialect_class: type[Dialect], count: int) -> str:
    """One INSERT of `count` interval rows (ROW_COLUMNS) that skips stored keys and returns
    (id, interval, rank) of the rows it inserted: one round trip per chunk of a batch."""
    dialect = _positional_dialect(dialect_class)
    one_row = _positional(dialect, intervals.insert().inline(), ROW_COLUMNS)  # inline: no RETURNING of its own
    head, values = one_row.split(" VALUES ")
    q = dialect.identifier_preparer.quote
    key = ", ".join(q(name) for name in ("run_pk", "interval", "rank"))
    return (
        f"{head} VALUES {', '.join([values] * count)} "
        f"ON CONFLICT ({key}) DO NOTHING RETURNING {q('id')}, {q('interval')}, {q('rank')}"
    )


@functools.cache
def _insert_details(dialect_class: type[Dialect]) -> str:
    return _positional(_positional_dialect(dialect_class), interval_details.insert(), interval_details.columns.keys())


# SQLite binds at most 32766 parameters per statement; PostgreSQL 65535.
INSERT_CHUNK = 32766 // len(ROW_COLUMNS)


# -- one batch ------------------------------------------------------------------------------------
def ingest_batch(session: Session, run: Run, records: Iterable[IntervalRecord]) -> IngestResult:
    """Store the records whose (rank, interval) is new for `run`, in one transaction.

    A key already stored (or repeated inside the batch) counts as a duplicate and the stored row is
    left untouched, so a spool replay after a lost response never changes or doubles data.
    """
    fresh: dict[Key, IntervalRecord] = {}
    received = 0
    for record in records:
        received += 1
        fresh.setdefault((record.interval, record.rank), record)
    rows = {key: interval_row(run.id, r) for key, r in fresh.items()}
    details = {key: (r.histograms.model_dump_json(), sync_sites_of(r)) for key, r in fresh.items()}
    inserted = insert_rows(session, run, rows, details)
    session.commit()
    return IngestResult(accepted=inserted, duplicates=received - inserted)


def insert_rows(
    session: Session,
    run: Run,
    rows: Mapping[Key, Sequence[Any]],
    details: Mapping[Key, tuple[str, Mapping[str, int]]],
) -> int:
    """Insert interval rows (ROW_COLUMNS tuples keyed (interval, rank)) with their details
    (histograms as JSON text, sync sites); feed only the new ones to the aggregates. Returns how
    many were new. The caller commits."""
    if not rows:
        return 0
    connection = session.connection()
    dialect_class = type(connection.dialect)
    ordered = [rows[key] for key in sorted(rows)]  # concurrent batches take index locks in one order
    new_ids: dict[Key, int] = {}
    for at in range(0, len(ordered), INSERT_CHUNK):
        chunk = ordered[at:at + INSERT_CHUNK]
        params = tuple(itertools.chain.from_iterable(chunk))
        inserted = connection.exec_driver_sql(_insert_new_intervals(dialect_class, len(chunk)), params)
        for interval_id, interval, rank in inserted:
            new_ids[(interval, rank)] = interval_id
    if not new_ids:
        return 0
    new_keys = sorted(new_ids)
    sites: dict[str, int] = {}
    for key in new_keys:
        for site, count in details[key][1].items():
            sites[site] = sites.get(site, 0) + count
    connection.exec_driver_sql(
        _insert_details(dialect_class),
        [(new_ids[key], details[key][0], json.dumps(details[key][1])) for key in new_keys],
    )
    store_aggregates(connection, run.id, coefficients(run), [rows[key] for key in new_keys], sites)
    session.execute(update(Run).where(Run.id == run.id).values(updated_at=_now()))
    return len(new_ids)
