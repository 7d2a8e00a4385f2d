"""Rollups, channel rollups, run totals and run sync sites of a set of new interval rows,
aggregated with numpy and upserted (adding) once per touched key: what the reads answer from
without scanning intervals."""

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sqlalchemy import Connection, Dialect
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.dialects.sqlite.pysqlite import SQLiteDialect_pysqlite

from packscope.backend.columns import BAND_COLUMNS, derive_columns, merge_blocks, rows_with_nulls, sums_per_row
from packscope.backend.models import ROLLUP_LEVELS, channel_rollups
from packscope.backend.rows import COLUMN_AT, FIELD_SLICE, ROW_COLUMNS
from packscope.backend.writes import write
from packscope.core.catalogue import BAND_METRICS, SUM_NAMES, Coefficients


def _per_row_blocks(rows: Sequence[Sequence[Any]], c: Coefficients) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(interval, int columns, float columns) of each row as its own block: its sums, its band
    metrics as both the min and the max, and its wall-clock start and end."""
    fields = np.array([row[FIELD_SLICE] for row in rows], dtype=float)  # None -> NaN
    by_name = {name: fields[:, i] for i, name in enumerate(ROW_COLUMNS[FIELD_SLICE])}
    sums = sums_per_row(by_name)
    rates = derive_columns(sums, c, BAND_METRICS)
    floats = np.column_stack(
        [sums[n] for n in SUM_NAMES]
        + [rates[n.rsplit("_", 1)[0]] for n in BAND_COLUMNS]
        + [by_name["wall_start"], by_name["wall_end"]]
    )
    steps = [(1, row[COLUMN_AT["first_step"]], row[COLUMN_AT["last_step"]]) for row in rows]
    return (
        np.array([row[COLUMN_AT["interval"]] for row in rows], dtype=np.int64),
        np.array(steps, dtype=np.int64),
        floats,
    )


def _as_dict(value: Any) -> dict[str, Any] | None:
    # Ingest hands the JSON text it inserts; a migration's SELECT hands it decoded.
    return json.loads(value) if isinstance(value, str) else value


def _channel_parts(rows: Sequence[Sequence[Any]]) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
    """(interval, channel, mean·tokens, tokens) of every channel a row reports with both a mean
    and a positive token count. Rows without channel_tokens (agents before 2026-11-30) give none:
    their means carry no weight, and a guessed one would skew the sums."""
    intervals: list[int] = []
    names: list[str] = []
    loss_sums: list[float] = []
    tokens: list[float] = []
    for row in rows:
        losses, counts = _as_dict(row[COLUMN_AT["channel_loss"]]), _as_dict(row[COLUMN_AT["channel_tokens"]])
        if not losses or not counts:
            continue
        for channel, n in counts.items():
            mean = losses.get(channel)
            if mean is None or not n:
                continue
            intervals.append(row[COLUMN_AT["interval"]])
            names.append(channel)
            loss_sums.append(mean * n)
            tokens.append(float(n))
    return np.array(intervals, dtype=np.int64), names, np.array(loss_sums), np.array(tokens)


def _channel_blocks(run_pk: int, rows: Sequence[Sequence[Any]]) -> list[tuple[Any, ...]]:
    """The channel_rollups rows (table order) the new interval rows add to, in key order."""
    intervals, names, loss_sums, tokens = _channel_parts(rows)
    if not names:
        return []
    channels, codes = np.unique(np.array(names, dtype=object), return_inverse=True)
    out = []
    for level in ROLLUP_LEVELS:
        keys, at = np.unique((intervals >> 2 * level) * len(channels) + codes, return_inverse=True)
        blocks, channel_of = np.divmod(keys, len(channels))
        summed = np.bincount(at, weights=loss_sums), np.bincount(at, weights=tokens)
        out += [
            (run_pk, level, b, channels[k], s, n)
            for b, k, s, n in zip(blocks.tolist(), channel_of.tolist(), *(x.tolist() for x in summed), strict=True)
        ]
    return out


_CHANNEL_COLUMNS = tuple(channel_rollups.columns.keys())
# The drivers' own positional styles: rows go to the driver's executemany as tuples, not through
# SQLAlchemy's per-row parameter handling (which doubled the cost of a record with channels).
_DRIVER_DIALECTS: dict[str, Any] = {
    "sqlite": lambda: SQLiteDialect_pysqlite(paramstyle="qmark"),
    "postgresql": lambda: PGDialect_psycopg(paramstyle="format"),
}


@functools.cache
def _channel_upsert(database: str) -> str:
    """INSERT … ON CONFLICT DO UPDATE adding both sums, as the driver's SQL."""
    dialect: Dialect = _DRIVER_DIALECTS[database]()
    insert = postgresql.insert if database == "postgresql" else sqlite.insert
    stmt = insert(channel_rollups)
    stored = channel_rollups.c
    stmt = stmt.on_conflict_do_update(
        index_elements=list(channel_rollups.primary_key.columns),
        set_={"loss_sum": stored.loss_sum + stmt.excluded.loss_sum, "tokens": stored.tokens + stmt.excluded.tokens},
    )
    compiled = stmt.compile(dialect=dialect, column_keys=list(_CHANNEL_COLUMNS))
    assert list(compiled.positiontup or ()) == list(_CHANNEL_COLUMNS), compiled.positiontup
    return str(compiled)


def _add_channel_rollups(connection: Connection, blocks: list[tuple[Any, ...]]) -> None:
    # writes.write knows only the tables it was built for; this one adds its two sums the same way.
    connection.exec_driver_sql(_channel_upsert(connection.dialect.name), blocks)


Blocks = tuple[np.ndarray, np.ndarray, np.ndarray]


def _write_rollups(connection: Connection, run_pk: int, rows: Sequence[Sequence[Any]], per_row: Blocks) -> None:
    keys, ints, floats = per_row
    blocks = []
    for level in ROLLUP_LEVELS:
        keys, ints, floats = merge_blocks(keys >> 2 if level else keys, ints, floats)
        listed = zip(keys.tolist(), ints.tolist(), rows_with_nulls(floats), strict=True)
        blocks += [(run_pk, level, key, *i, *f) for key, i, f in listed]
    write(connection, "rollups", "add", blocks)
    channel_blocks = _channel_blocks(run_pk, rows)
    if channel_blocks:
        _add_channel_rollups(connection, channel_blocks)


def _write_totals(
    connection: Connection, run_pk: int, rows: Sequence[Sequence[Any]], per_row: Blocks, sync_sites: Mapping[str, int]
) -> None:
    _, ints, floats = per_row
    last_interval = max(row[COLUMN_AT["interval"]] for row in rows)
    sums = floats[:, : len(SUM_NAMES)].sum(axis=0).tolist()
    totals = (run_pk, len(rows), last_interval, int(ints[:, 2].max()), *sums)
    write(connection, "run_totals", "add", [totals])
    if sync_sites:
        sites = [(run_pk, site, n) for site, n in sorted(sync_sites.items())]
        write(connection, "run_sync_sites", "add", sites)


def store_rollups(connection: Connection, run_pk: int, c: Coefficients, rows: Sequence[Sequence[Any]]) -> None:
    """Add interval rows (ROW_COLUMNS tuples, sorted by interval then rank) to the run's rollups
    and channel rollups at every level (migration 0006 rebuilds them with this)."""
    if rows:
        _write_rollups(connection, run_pk, rows, _per_row_blocks(rows, c))


def store_totals(
    connection: Connection, run_pk: int, c: Coefficients, rows: Sequence[Sequence[Any]], sync_sites: Mapping[str, int]
) -> None:
    """Add interval rows to the run's totals and sync sites (migration 0003 backfills with this)."""
    if rows:
        _write_totals(connection, run_pk, rows, _per_row_blocks(rows, c), sync_sites)


def store_aggregates(
    connection: Connection, run_pk: int, c: Coefficients, rows: Sequence[Sequence[Any]], sync_sites: Mapping[str, int]
) -> None:
    """Add new interval rows (sorted by interval then rank) to everything kept at ingest. Keys are
    written in sorted order, table by table, so concurrent batches of one run lock rows in the
    same order and cannot deadlock."""
    if not rows:
        return
    per_row = _per_row_blocks(rows, c)
    _write_rollups(connection, run_pk, rows, per_row)
    _write_totals(connection, run_pk, rows, per_row, sync_sites)
