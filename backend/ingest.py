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
from datetime import UTC, datetime
from typing import Any, Literal

import numpy as np
from sqlalchemy import ColumnElement, Connection, Dialect, Table, bindparam, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite
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
from packscope.core.catalogue import BAND_METRICS, FIELDS, SUM_NAMES, Coefficients, Field


class ModelConflict(Exception):
    """A resume sent a different FLOPs model than the one stored with the run."""


def _now() -> datetime:
    return datetime.now(UTC)


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
    if body.status is None:  # RunPatch also carries edits without a status (routes/ingest.update_run)
        return run
    run.status = body.status
    run.ended_at = None if body.status == "running" else (body.ended_at or now)
    run.updated_at = now
    session.commit()
    return run


# -- rows of a batch -------------------------------------------------------------------------------
def _wire_groups() -> list[tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]], tuple[str, ...]]]:
    """(parent path, getter of its values, field names) per object of the wire record that holds
    catalogue fields: one C-level attrgetter call per object instead of a getattr per field."""
    by_parent: dict[tuple[str, ...], list[Field]] = {}
    for f in FIELDS:
        by_parent.setdefault(f.wire_path[:-1], []).append(f)
    groups: list[tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]], tuple[str, ...]]] = []
    for parent, fields in by_parent.items():
        get = operator.attrgetter(*(f.wire_path[-1] for f in fields))
        as_tuple = get if len(fields) > 1 else (lambda obj, one=get: (one(obj),))  # one name: a bare value
        groups.append((parent, as_tuple, tuple(f.name for f in fields)))
    return groups


_WIRE_GROUPS = _wire_groups()
# The columns of an inserted interval row: the table's, without the generated id.
ROW_COLUMNS = tuple(name for name in intervals.columns.keys() if name != "id")  # noqa: SIM118
_AT = {name: i for i, name in enumerate(ROW_COLUMNS)}
_FIELD_SLICE = slice(_AT[FIELDS[0].name], _AT[FIELDS[-1].name] + 1)  # the catalogue fields of a row
# From the values in the order interval_row gathers them to ROW_COLUMNS order.
_GATHERED = ("run_pk", *(name for _, _, names in _WIRE_GROUPS for name in names), "channel_loss")
_TO_ROW_ORDER = operator.itemgetter(*(_GATHERED.index(name) for name in ROW_COLUMNS))
Key = tuple[int, int]  # (interval, rank)


def interval_row(run_pk: int, r: IntervalRecord) -> tuple[Any, ...]:
    """The record's table row in ROW_COLUMNS order: every catalogue field, read from its place on
    the wire (None where an optional object is missing), and channel_loss as JSON text."""
    values: list[Any] = [run_pk]
    for parent, get, names in _WIRE_GROUPS:
        obj: Any = r
        for key in parent:
            obj = getattr(obj, key)
        values.extend((None,) * len(names) if obj is None else get(obj))
    values.append(None if r.channel_loss is None else json.dumps(r.channel_loss, sort_keys=True))
    return _TO_ROW_ORDER(values)


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
    keys, ints, floats = _per_row_blocks(rows, c)
    blocks = []
    for level in ROLLUP_LEVELS:
        keys, ints, floats = merge_blocks(keys >> 2 if level else keys, ints, floats)
        listed = zip(keys.tolist(), ints.tolist(), rows_with_nulls(floats), strict=True)
        blocks += [(run_pk, level, key, *i, *f) for key, i, f in listed]
    _write(connection, "rollups", "add", blocks)
    # The top level covers every new row once.
    last_interval = max(row[_AT["interval"]] for row in rows)
    sums = floats[:, : len(SUM_NAMES)].sum(axis=0).tolist()
    totals = (run_pk, int(ints[:, 0].sum()), last_interval, int(ints[:, 2].max()), *sums)
    _write(connection, "run_totals", "add", [totals])
    if sync_sites:
        sites = [(run_pk, site, n) for site, n in sorted(sync_sites.items())]
        _write(connection, "run_sync_sites", "add", sites)


# -- statements, compiled once per dialect to the driver's own SQL --------------------------------
# Rows reach the driver as tuples, never through SQLAlchemy's per-row parameter handling:
# * SQLite: executemany of a one-row statement (sqlite3 loops in C), and for the interval rows a
#   multi-row VALUES, since sqlite3's executemany returns no RETURNING rows;
# * PostgreSQL: one statement per table and batch that reads its rows from one array per column
#   (INSERT … SELECT FROM unnest(…)); psycopg re-parses long statements on every call, so a
#   multi-row VALUES would cost more than the insert.
_TABLES = {t.name: t for t in (intervals, interval_details, rollups, run_totals, run_sync_sites)}
_WRITTEN = {name: tuple(c for c in t.columns.keys() if c != "id") for name, t in _TABLES.items()}  # noqa: SIM118
Action = Literal["insert", "add", "insert_new"]


def _insert(dialect: Dialect, table: Table) -> postgresql.Insert | sqlite.Insert:
    # ON CONFLICT has the same spelling on both backends, but lives in dialect modules.
    if dialect.name == "postgresql":
        return postgresql.insert(table)
    if dialect.name == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"unsupported database {dialect.name!r}; use SQLite or PostgreSQL")


def _adding(stmt: postgresql.Insert | sqlite.Insert, table: Table, dialect: Dialect) -> dict[str, Any]:
    """The DO UPDATE changes of an aggregate table: counts and sums add, steps and bands widen."""
    key = [c.name for c in table.primary_key.columns]
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
    return changes


# The drivers whose parameter styles the statements are written for (psycopg's %b is its own).
_DRIVER_DIALECTS: dict[str, Callable[[], Dialect]] = {
    "sqlite": lambda: SQLiteDialect_pysqlite(paramstyle="qmark"),
    "postgresql": lambda: PGDialect_psycopg(paramstyle="format"),
}


def _driver_of(connection: Connection) -> str:
    dialect = connection.dialect
    if (dialect.name, dialect.driver) not in (("sqlite", "pysqlite"), ("postgresql", "psycopg")):
        raise RuntimeError(f"unsupported driver {dialect.name}+{dialect.driver}; use sqlite or postgresql+psycopg")
    return dialect.name


@functools.cache
def _statement(database: str, table_name: str, action: Action, rows: int = 1) -> str:
    """The SQL that writes `rows` rows (SQLite) or one array per column (PostgreSQL) of `_WRITTEN`
    columns to `table_name`. insert: plain; add: upsert adding to the stored aggregates;
    insert_new: skip stored keys and return (id, interval, rank) of the rows inserted."""
    dialect = _DRIVER_DIALECTS[database]()
    table, columns = _TABLES[table_name], _WRITTEN[table_name]
    stmt: Any = _insert(dialect, table)
    if dialect.name == "postgresql":
        arrays = [bindparam(name, type_=postgresql.ARRAY(table.c[name].type)) for name in columns]
        stmt = stmt.from_select(columns, select(*func.unnest(*arrays).table_valued(*columns).render_derived().c))
    if action == "add":
        stmt = stmt.on_conflict_do_update(index_elements=table.primary_key.columns, set_=_adding(stmt, table, dialect))
    elif action == "insert_new":
        key = table.c.run_pk, table.c.interval, table.c.rank
        stmt = stmt.on_conflict_do_nothing(index_elements=key).returning(table.c.id, table.c.interval, table.c.rank)
    compiled = stmt.compile(dialect=dialect, column_keys=list(columns))
    assert list(compiled.positiontup or ()) == list(columns), compiled.positiontup
    sql = str(compiled)
    if dialect.name == "postgresql":
        sql = sql.replace("%s", "%b")  # binary parameters: psycopg dumps arrays as text 5x slower
    if rows > 1:
        one_row = f"({', '.join('?' * len(columns))})"
        sql = sql.replace(one_row, ", ".join([one_row] * rows), 1)
    return sql


# SQLite binds at most 32766 parameters per statement.
_SQLITE_ROWS = 32766 // len(ROW_COLUMNS)


def _write(connection: Connection, table_name: str, action: Action, rows: Sequence[Sequence[Any]]) -> list[Any]:
    """Write `rows` (tuples of `_WRITTEN` columns) in one statement per chunk; the RETURNING rows."""
    database = _driver_of(connection)
    if database == "postgresql":
        arrays = tuple(map(list, zip(*rows, strict=True)))
        result = connection.exec_driver_sql(_statement(database, table_name, action), arrays)
        return list(result.all()) if action == "insert_new" else []
    if action != "insert_new":
        connection.exec_driver_sql(_statement(database, table_name, action), list(rows))
        return []
    returned: list[Any] = []
    for at in range(0, len(rows), _SQLITE_ROWS):
        chunk = rows[at : at + _SQLITE_ROWS]
        sql = _statement(database, table_name, action, len(chunk))
        returned += connection.exec_driver_sql(sql, tuple(itertools.chain.from_iterable(chunk))).all()
    return returned


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
        fresh.setdefault((getattr(record, "interval"), getattr(record, "rank")), record)  # noqa: B009 - generated fields
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
    ordered = [rows[key] for key in sorted(rows)]  # concurrent batches take index locks in one order
    inserted = _write(connection, "intervals", "insert_new", ordered)
    new_ids = {(interval, rank): interval_id for interval_id, interval, rank in inserted}
    if not new_ids:
        return 0
    new_keys = sorted(new_ids)
    sites: dict[str, int] = {}
    for key in new_keys:
        for site, count in details[key][1].items():
            sites[site] = sites.get(site, 0) + count
    new_details = [(new_ids[key], details[key][0], json.dumps(details[key][1])) for key in new_keys]
    _write(connection, "interval_details", "insert", new_details)
    store_aggregates(connection, run.id, coefficients(run), [rows[key] for key in new_keys], sites)
    session.execute(update(Run).where(Run.id == run.id).values(updated_at=_now()))
    return len(new_ids)
