"""Bulk writes, compiled once per dialect to the driver's own SQL.

Rows reach the driver as tuples, never through SQLAlchemy's per-row parameter handling.
"""

import functools
import itertools
from collections.abc import Callable, Sequence
from typing import Any, Literal

from pydantic_core import to_json
from sqlalchemy import (
    ColumnElement,
    Connection,
    Dialect,
    Integer,
    Table,
    bindparam,
    case,
    cast,
    func,
    literal_column,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

from packscope.backend.formulas.columns import merged_by
from packscope.backend.store.db import run_sql
from packscope.backend.store.models import (
    ROW_COLUMNS,
    STAMPED,
    channel_rollups,
    interval_details,
    interval_histogram_sums,
    intervals,
    rank_summaries,
    rank_time_buckets,
    rollups,
    run_first_sync_sites,
    run_sync_sites,
    run_totals,
)
from packscope.core.catalogue import INT64_MAX

# The channel a batch's statement NOTIFYs its run id on, LISTENed to by every server process (http/live.py).
NOTIFY_CHANNEL = "packscope_intervals"

# Rows reach the driver as tuples, never through SQLAlchemy's per-row parameter handling:
# * SQLite: executemany of a one-row statement (sqlite3 loops in C), and for the interval rows a
#   multi-row VALUES, since sqlite3's executemany returns no RETURNING rows;
# * PostgreSQL: one statement per table and batch that reads its rows from one parameter, the rows
#   as a JSON array of arrays (INSERT … SELECT (e->>0)::type, … FROM jsonb_array_elements(…) e).
#   pydantic-core writes the JSON in Rust and PostgreSQL reads it in C; psycopg dumps arrays
#   (even binary ones) element by element in Python, which cost more than the insert, and
#   re-parses long statements on every call, so a multi-row VALUES would too. Numbers keep their
#   exact value: JSON holds a float's shortest round-trip text, and a non-finite one as a string
#   that float8 reads back.
_TABLES = {
    t.name: t
    for t in (
        intervals, interval_details, rollups, channel_rollups, run_totals, run_sync_sites,
        rank_summaries, rank_time_buckets, interval_histogram_sums, run_first_sync_sites,
    )
}  # fmt: skip
# Every column but the id and the stamps that the database's triggers write (models.STAMPED).
_WRITTEN = {name: tuple(c for c in t.columns.keys() if c != "id" and c not in STAMPED) for name, t in _TABLES.items()}  # noqa: SIM118
Action = Literal["insert", "add", "insert_new"]


def _insert(dialect: Dialect, table: Table) -> postgresql.Insert | sqlite.Insert:
    # ON CONFLICT has the same spelling on both backends, but lives in dialect modules.
    if dialect.name == "postgresql":
        return postgresql.insert(table)
    if dialect.name == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"unsupported database {dialect.name!r}; use SQLite or PostgreSQL")


def adding(stmt: Any, target: Any, key: Sequence[str], database: str) -> dict[str, Any]:
    """The DO UPDATE changes of an aggregate table (`target`: a Table, or the column subset a
    statement lists): counts and sums add (an integer one stops at INT64_MAX, where SQLite would
    raise and PostgreSQL refuse), steps and bands widen. Every aggregate upsert uses it."""
    least, greatest = (func.least, func.greatest) if database == "postgresql" else (func.min, func.max)

    def widen(pick: Any, stored: ColumnElement[Any], new: ColumnElement[Any]) -> ColumnElement[Any]:
        return func.coalesce(pick(stored, new), stored, new)  # SQLite's min(x, NULL) is NULL

    changes: dict[str, Any] = {}
    for column in target.columns:
        stored, new = column, stmt.excluded[column.name]
        if column.name in key or column.name in STAMPED:  # a stamp: the database's trigger writes it
            continue
        how = merged_by(column.name)
        if how == "min":
            changes[column.name] = widen(least, stored, new)
        elif how == "max":
            changes[column.name] = widen(greatest, stored, new)
        elif isinstance(column.type, Integer):  # an integer sum saturates instead of overflowing
            most: ColumnElement[int] = literal_column(str(INT64_MAX))
            changes[column.name] = case((new > most - stored, most), else_=stored + new)
        else:
            changes[column.name] = stored + new
    return changes


# The drivers whose parameter styles the statements are written for (psycopg's %b is its own).
DRIVER_DIALECTS: dict[str, Callable[[], Dialect]] = {
    "sqlite": lambda: SQLiteDialect_pysqlite(paramstyle="qmark"),
    "postgresql": lambda: PGDialect_psycopg(paramstyle="format"),
}


def driver_of(connection: Connection) -> str:
    """'sqlite' or 'postgresql': the database whose driver's own SQL the statements here are."""
    dialect = connection.dialect
    if (dialect.name, dialect.driver) not in (("sqlite", "pysqlite"), ("postgresql", "psycopg")):
        raise RuntimeError(f"unsupported driver {dialect.name}+{dialect.driver}; use sqlite or postgresql+psycopg")
    return dialect.name


@functools.cache
def _statement(database: str, table_name: str, action: Action, rows: int = 1) -> str:
    """The SQL that writes `rows` rows (SQLite) or one array per column (PostgreSQL) of `_WRITTEN`
    columns to `table_name`. insert: plain; add: upsert adding to the stored aggregates;
    insert_new: skip stored keys and return (id, interval, rank) of the rows inserted."""
    dialect = DRIVER_DIALECTS[database]()
    table, columns = _TABLES[table_name], _WRITTEN[table_name]
    stmt: Any = _insert(dialect, table)
    if dialect.name == "postgresql":
        element = func.jsonb_array_elements(bindparam("rows", type_=postgresql.JSONB)).table_valued("value")
        element = element.alias("e")
        values = [
            cast(element.c.value.op("->>")(literal_column(str(at))), table.c[name].type)
            for at, name in enumerate(columns)
        ]
        stmt = stmt.from_select(columns, select(*values).select_from(element))
    if action == "add":
        stmt = stmt.on_conflict_do_update(
            index_elements=table.primary_key.columns,
            set_=adding(stmt, table, [c.name for c in table.primary_key.columns], dialect.name),
        )
    elif action == "insert_new":
        key = table.c.run_pk, table.c.interval, table.c.rank
        stmt = stmt.on_conflict_do_nothing(index_elements=key).returning(table.c.id, table.c.interval, table.c.rank)
    compiled = stmt.compile(dialect=dialect, column_keys=list(columns))
    expected = ["rows"] if dialect.name == "postgresql" else list(columns)
    assert list(compiled.positiontup or ()) == expected, compiled.positiontup
    sql = str(compiled)
    if rows > 1:
        one_row = f"({', '.join('?' * len(columns))})"
        sql = sql.replace(one_row, ", ".join([one_row] * rows), 1)
    return sql


# SQLite binds at most 32766 parameters per statement.
_SQLITE_ROWS = 32766 // len(ROW_COLUMNS)


def write(connection: Connection, table_name: str, action: Action, rows: Sequence[Sequence[Any]]) -> list[Any]:
    """Write `rows` (tuples of `_WRITTEN` columns) in one statement per chunk; the RETURNING rows."""
    database = driver_of(connection)
    if database == "postgresql":
        document = to_json(rows, inf_nan_mode="strings").decode()
        return run_sql(connection, _statement(database, table_name, action), (document,))
    if action != "insert_new":
        return run_sql(connection, _statement(database, table_name, action), rows, many=True)
    returned: list[Any] = []
    for at in range(0, len(rows), _SQLITE_ROWS):
        chunk = rows[at : at + _SQLITE_ROWS]
        sql = _statement(database, table_name, action, len(chunk))
        returned += run_sql(connection, sql, tuple(itertools.chain.from_iterable(chunk)))
    return returned


@functools.cache
def _adding_together(table_names: tuple[str, ...]) -> str:
    """PostgreSQL: the "add" upserts of several tables as one statement, all but the last as
    data-modifying WITH queries, one JSON document parameter each in this order. PostgreSQL runs
    them in one fixed order for the one statement text, so concurrent batches still take the
    aggregate rows' locks in one order (each table's rows in key order, as before)."""
    parts = [_statement("postgresql", name, "add") for name in table_names]
    if len(parts) == 1:
        return parts[0]
    withs = ", ".join(f"add_{name} AS ({sql})" for name, sql in zip(table_names[:-1], parts[:-1], strict=True))
    return f"WITH {withs} {parts[-1]}"


def add_together(connection: Connection, writes: Sequence[tuple[str, Sequence[Sequence[Any]]]]) -> None:
    """PostgreSQL: upsert (adding, as write(..., "add", ...)) each (table, rows) of `writes` in one
    statement, one round trip instead of one per table. (SQLite has no round trips to save:
    aggregates.py runs its own upserts there.)"""
    if driver_of(connection) != "postgresql":
        raise ValueError("add_together writes PostgreSQL's statement; on SQLite write each table")
    present = [(name, rows) for name, rows in writes if rows]
    if not present:
        return
    documents = [to_json(rows, inf_nan_mode="strings").decode() for _, rows in present]
    run_sql(connection, _adding_together(tuple(name for name, _ in present)), documents)


_AT_INTERVAL, _AT_RANK = _WRITTEN["intervals"].index("interval"), _WRITTEN["intervals"].index("rank")
# New records are contact (a running run's liveness reads updated_at), never a status: a run
# marked finished or failed keeps it. Records that land after the mark were made before it (a
# batch in flight at SIGTERM, another rank's last interval after rank 0's "finished", a spool
# synced later: docs/wire.md); a trainer that goes on after all says "running" itself.
_TOUCH_RUN = {
    "sqlite": "UPDATE runs SET updated_at = ? WHERE id = ?",
    "postgresql": "UPDATE runs SET updated_at = %s WHERE id = %s",
}


@functools.cache
def _intervals_with_details() -> str:
    """PostgreSQL: the new interval rows, their details and the run's updated_at in one statement
    (one round trip instead of three). Two documents: the interval rows, and per row its key with
    its histograms' and sync sites' JSON text; the details join the rows inserted on their key.
    When any row is new, the run's id is NOTIFYed on live push's channel, which PostgreSQL sends
    at commit to every server process (live.PostgresNotify): no round trip of its own after it."""
    details = ", ".join(c for c in _WRITTEN["interval_details"])
    assert details == "interval_id, histograms, sync_sites", details
    return (
        f"WITH ins AS ({_statement('postgresql', 'intervals', 'insert_new')}), "
        f"det AS (INSERT INTO interval_details ({details}) "
        "SELECT ins.id, CAST(d.value ->> 2 AS JSON), CAST(d.value ->> 3 AS JSON) "
        "FROM ins JOIN jsonb_array_elements(%s::JSONB) AS d "
        "ON CAST(d.value ->> 0 AS INTEGER) = ins.interval AND CAST(d.value ->> 1 AS INTEGER) = ins.rank), "
        "touched AS (UPDATE runs SET updated_at = %s WHERE id = %s AND EXISTS (SELECT FROM ins) "
        # A data-modifying WITH query runs to completion, its RETURNING included, read or not.
        f"RETURNING pg_notify('{NOTIFY_CHANNEL}', run_id)) "
        "SELECT id, interval, rank FROM ins"
    )


def insert_intervals(
    connection: Connection,
    rows: Sequence[Sequence[Any]],
    details: Sequence[tuple[str, str]],
    run_pk: int,
    updated_at: Any,
) -> list[Any]:
    """Insert the interval rows (distinct keys) whose (run, interval, rank) is not stored yet, with
    their details (histograms' and sync sites' JSON text, one pair per row), and set the run's
    updated_at (as the driver binds it) when any was new; the (id, interval, rank) inserted."""
    database = driver_of(connection)
    if database == "postgresql":
        keyed = [(row[_AT_INTERVAL], row[_AT_RANK], *detail) for row, detail in zip(rows, details, strict=True)]
        documents = to_json(rows, inf_nan_mode="strings").decode(), to_json(keyed).decode()
        return run_sql(connection, _intervals_with_details(), (*documents, updated_at, run_pk))
    inserted = write(connection, "intervals", "insert_new", rows)
    if inserted:
        at = {(row[_AT_INTERVAL], row[_AT_RANK]): k for k, row in enumerate(rows)}
        write(connection, "interval_details", "insert", [(i, *details[at[key, rank]]) for i, key, rank in inserted])
        run_sql(connection, _TOUCH_RUN[database], (updated_at, run_pk))
    return inserted
