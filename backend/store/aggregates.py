"""Rollups, channel rollups, run totals, run sync sites and the run's first interval (its sums and sync
sites) of a set of new interval rows,
aggregated with numpy and upserted (adding) once per touched key: what the reads answer from
without scanning intervals.

Cost per batch is what this module is about (issue 8): the rows' numbers are read into one float
matrix, every stored level's blocks come out of one `reduceat` pass over it, and on SQLite the
upserts go to the driver's own `executemany` (sqlite3 loops in C; SQLAlchemy's execution layer
cost more per call than the statement). Level 0 is not stored: the reads group the interval rows
themselves (reads/series.py), so a batch of 64 consecutive intervals touches about 28 rollup rows
with one rank and 12 with eight, instead of 92 and 20.
"""

import functools
import itertools
import json
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
from pydantic_core import to_json
from sqlalchemy import Connection
from sqlalchemy import column as sa_column
from sqlalchemy import table as sa_table
from sqlalchemy.dialects import sqlite

from packscope.backend.formulas.columns import (
    BLOCK_FLOAT_COLUMNS,
    BLOCK_INT_COLUMNS,
    WALL_EXTENTS,
    derive_columns,
    merged_by,
    sums_matrix,
)
from packscope.backend.store.db import run_sql
from packscope.backend.store.models import (
    CHANNEL_LEVELS,
    COLUMN_AT,
    STAMPED,
    STORED_LEVELS,
    channel_rollups,
    rollups,
    run_first_interval,
    run_sync_sites,
    run_totals,
)
from packscope.backend.store.writes import DRIVER_DIALECTS, add_together, adding, driver_of, write
from packscope.core.catalogue import BAND_METRICS, INT64_MAX, SUM_FIELDS, SUM_NAMES, Coefficients

# What a row contributes, read in one C-level call per row: the key and step columns, the wall
# clock and every field a SUM reads (None -> NaN in the float matrix).
READ_COLUMNS = ("interval", "first_step", "last_step", "wall_start", "wall_end", *SUM_FIELDS)
_GET = operator.itemgetter(*(COLUMN_AT[name] for name in READ_COLUMNS))

# A block's columns in three contiguous groups, so one reduceat per group merges blocks: those
# that add, those that keep the least, those that keep the greatest (columns.merged_by).
_BLOCK_COLUMNS = (*BLOCK_INT_COLUMNS, *BLOCK_FLOAT_COLUMNS)
_ADDED, _LEAST, _GREATEST = (tuple(c for c in _BLOCK_COLUMNS if merged_by(c) == how) for how in ("sum", "min", "max"))
_GROUPED = (*_ADDED, *_LEAST, *_GREATEST)
_AT_GROUPED = {name: i for i, name in enumerate(_GROUPED)}
_LEAST_AT = len(_ADDED)
_GREATEST_AT = _LEAST_AT + len(_LEAST)
# From the grouped layout to the rollups table's (BLOCK_INT_COLUMNS, then BLOCK_FLOAT_COLUMNS).
_TABLE_ORDER = np.array([_AT_GROUPED[name] for name in _BLOCK_COLUMNS])
_INTS = len(BLOCK_INT_COLUMNS)
_SUMS_AT = [_AT_GROUPED[name] for name in SUM_NAMES]
_BAND_AT = [(_AT_GROUPED[f"{name}_min"], _AT_GROUPED[f"{name}_max"]) for name in BAND_METRICS]
# The block's extents that a single row gives as they are: (block column, READ_COLUMNS field).
_EXTENTS = (("first_step", "first_step"), ("last_step", "last_step"), *WALL_EXTENTS)
_READ_AT = {name: i for i, name in enumerate(READ_COLUMNS)}
_EXTENT_AT = ([_AT_GROUPED[block] for block, _ in _EXTENTS], [_READ_AT[field] for _, field in _EXTENTS])


def _field_matrix(rows: Sequence[Sequence[Any]]) -> np.ndarray:
    """The READ_COLUMNS of ROW_COLUMNS tuples as floats, NaN where a reading is missing (None):
    straight from an iterator, no list of tuples in between."""
    flat = np.fromiter(itertools.chain.from_iterable(map(_GET, rows)), dtype=float, count=len(rows) * len(READ_COLUMNS))
    return flat.reshape(len(rows), len(READ_COLUMNS))


def _per_row(values: np.ndarray, c: Coefficients) -> tuple[np.ndarray, np.ndarray]:
    """(interval of each row, each row as its own block in the grouped layout): its sums (the
    catalogue's, columns.sums_matrix), its band metrics as both the least and the greatest, its
    steps and wall-clock start and end; from the rows' READ_COLUMNS as a float matrix."""
    out = np.empty((len(values), len(_GROUPED)))
    out[:, _AT_GROUPED["rows"]] = 1.0
    sums = sums_matrix(values, _READ_AT)
    out[:, _SUMS_AT] = sums
    rates = derive_columns({name: sums[:, j] for j, name in enumerate(SUM_NAMES)}, c, BAND_METRICS)
    for (least, greatest), name in zip(_BAND_AT, BAND_METRICS, strict=True):
        out[:, least] = out[:, greatest] = rates[name]
    out[:, _EXTENT_AT[0]] = values[:, _EXTENT_AT[1]]
    return values[:, _READ_AT["interval"]].astype(np.int64), out


def _merge_levels(
    intervals: np.ndarray, per_row: np.ndarray, levels: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(level, block, merged block in the grouped layout) of every block of `levels` the rows
    touch, in (level, block) order, from one reduceat per column group: the rows (sorted by
    interval) are laid end to end once per level, and each level's blocks are runs of them.
    From the first level where all rows share one block, every coarser level holds the same
    merged block (only its index differs), so that one is merged once and repeated."""
    n = len(intervals)
    keys = intervals[None, :] >> (2 * levels[:, None])
    # The first level whose block holds both the first and the last interval (sorted: all rows).
    apart = (int(intervals[0]) ^ int(intervals[-1])).bit_length()  # the lowest bit they agree above
    coarse = [i for i, level in enumerate(levels.tolist()) if 2 * level >= apart]
    merged_levels = coarse[0] + 1 if coarse else len(levels)
    starts_here = np.ones((merged_levels, n), dtype=bool)
    starts_here[:, 1:] = keys[:merged_levels, 1:] != keys[:merged_levels, :-1]
    level_at, row_at = np.nonzero(starts_here)
    starts = level_at * n + row_at
    tiled = np.tile(per_row, (merged_levels, 1)) if merged_levels > 1 else per_row
    merged = np.empty((len(starts) + len(levels) - merged_levels, per_row.shape[1]))
    done = len(starts)
    with np.errstate(over="ignore", invalid="ignore"):  # sums past 1.8e308 are inf (inf - inf: NaN), as in Python
        merged[:done, :_LEAST_AT] = np.add.reduceat(tiled[:, :_LEAST_AT], starts)
    # fmin/fmax skip NaN (undefined rates, unknown wall clocks)
    merged[:done, _LEAST_AT:_GREATEST_AT] = np.fmin.reduceat(tiled[:, _LEAST_AT:_GREATEST_AT], starts)
    merged[:done, _GREATEST_AT:] = np.fmax.reduceat(tiled[:, _GREATEST_AT:], starts)
    merged[done:] = merged[done - 1]
    level_of = np.concatenate([levels[level_at], levels[merged_levels:]])
    block_of = np.concatenate([keys[level_at, row_at], keys[merged_levels:, 0]])
    return level_of, block_of, merged


def _table_rows(
    database: str, run_pk: int, levels: np.ndarray, blocks: np.ndarray, merged: np.ndarray
) -> list[list[Any]]:
    """Rollup rows: for SQLite (run_pk, level, block, the grouped layout), floats alone (one
    tolist), which it stores as integers in INTEGER columns when integral and as NULL when NaN;
    for PostgreSQL (writes.write) in the table's column order, with Python ints for the key,
    counts and steps and None for NaN."""
    if database == "sqlite":  # the statement lists the columns in the grouped layout
        out = np.empty((len(blocks), 3 + merged.shape[1]))
        out[:, 0] = run_pk
        out[:, 1] = levels
        out[:, 2] = blocks
        out[:, 3:] = merged
        return out.tolist()
    ordered = merged[:, _TABLE_ORDER]
    listed = np.empty((len(blocks), 3 + ordered.shape[1]), dtype=object)
    listed[:, 0] = run_pk
    listed[:, 1] = levels
    listed[:, 2] = blocks
    listed[:, 3 : 3 + _INTS] = ordered[:, :_INTS].astype(np.int64)
    floats = ordered[:, _INTS:]
    listed[:, 3 + _INTS :] = floats
    listed[:, 3 + _INTS :][np.isnan(floats)] = None
    return listed.tolist()


# -- the driver's own statements -------------------------------------------------------------------
# Rows reach the driver as lists, not through SQLAlchemy's per-row parameter handling; on SQLite
# straight to sqlite3's executemany (SQLAlchemy's execution layer cost more a call than the
# statement: docs/benchmarks/2026-11-30-2core.md, "Ingest"), on
# PostgreSQL through writes.write. The columns each SQLite statement lists, in its rows' order.
_TABLES = {t.name: t for t in (rollups, channel_rollups, run_totals, run_sync_sites)}
_COLUMNS = {name: tuple(c for c in t.columns.keys() if c not in STAMPED) for name, t in _TABLES.items()}  # noqa: SIM118
_COLUMNS["rollups"] = ("run_pk", "level", "block", *_GROUPED)


@functools.cache
def _sqlite_upsert(table_name: str) -> str:
    """INSERT … ON CONFLICT DO UPDATE adding to the stored aggregates, as sqlite3's SQL, its values
    in _COLUMNS order."""
    table = _TABLES[table_name]
    target = sa_table(table_name, *(sa_column(name, table.c[name].type) for name in _COLUMNS[table_name]))
    stmt = sqlite.insert(target)
    key = [c.name for c in table.primary_key.columns]
    stmt = stmt.on_conflict_do_update(index_elements=key, set_=adding(stmt, target, key, "sqlite"))
    columns = list(_COLUMNS[table_name])
    compiled = stmt.compile(dialect=DRIVER_DIALECTS["sqlite"](), column_keys=columns)
    assert list(compiled.positiontup or ()) == columns, compiled.positiontup
    return str(compiled)


def _add(connection: Connection, table_name: str, rows: Sequence[Sequence[Any]]) -> None:
    """Upsert `rows` (in key order) adding to what is stored: on SQLite in _COLUMNS order, on
    PostgreSQL in the table's column order (writes.write)."""
    if connection.dialect.name == "sqlite":
        driver = connection.connection.driver_connection
        assert driver is not None
        driver.executemany(_sqlite_upsert(table_name), rows)
    else:
        write(connection, table_name, "add", rows)


# -- channel rollups -------------------------------------------------------------------------------
def _as_dict(value: Any) -> dict[str, Any] | None:
    # Ingest hands the JSON text it inserts; a migration's SELECT hands it decoded.
    return json.loads(value) if isinstance(value, str) else value


_CHANNEL_GET = operator.itemgetter(COLUMN_AT["interval"], COLUMN_AT["channel_loss"], COLUMN_AT["channel_tokens"])
_TOKENS_GET = operator.itemgetter(COLUMN_AT["channel_tokens"])


_INTERVAL_GET = operator.itemgetter(COLUMN_AT["interval"])
Channels = Sequence[tuple[Any, Any]]  # per row, (channel_loss, channel_tokens) as decoded


def _channel_parts(
    rows: Sequence[Sequence[Any]], channels: Channels | None
) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
    """(interval, channel, mean·tokens, tokens) of every channel a row reports with both a mean
    and a positive token count, from the rows' JSON text, or from `channels` (the same values as
    decoded, one pair per row) when given. Rows without channel_tokens (agents before 2026-11-30)
    give none: their means carry no weight, and a guessed one would skew the sums."""
    if channels is None:
        return channel_parts(map(_CHANNEL_GET, rows))
    return channel_parts(
        (i, loss, tokens) for i, (loss, tokens) in zip(map(_INTERVAL_GET, rows), channels, strict=True)
    )


def channel_parts(
    triples: Iterable[tuple[int, Any, Any]],
) -> tuple[np.ndarray, list[str], np.ndarray, np.ndarray]:
    """_channel_parts of (interval, channel_loss, channel_tokens) triples (JSON text or decoded):
    what the series reads for level 0, which channel_rollups does not store."""
    intervals: list[int] = []
    names: list[str] = []
    loss_sums: list[float] = []
    tokens: list[float] = []
    for interval, loss_json, tokens_json in triples:
        if loss_json is None or tokens_json is None:
            continue
        losses, counts = _as_dict(loss_json), _as_dict(tokens_json)
        if not losses or not counts:
            continue
        for channel, n in counts.items():
            mean = losses.get(channel)
            if mean is None or not n:
                continue
            intervals.append(interval)
            names.append(channel)
            loss_sums.append(mean * n)
            tokens.append(float(n))
    return np.array(intervals, dtype=np.int64), names, np.array(loss_sums), np.array(tokens)


def _channel_blocks(run_pk: int, rows: Sequence[Sequence[Any]], decoded: Channels | None) -> list[tuple[Any, ...]]:
    """The channel_rollups rows (table order) the new interval rows add to, in key order."""
    intervals, names, loss_sums, tokens = _channel_parts(rows, decoded)
    if not names:
        return []
    channels, codes = np.unique(np.array(names, dtype=object), return_inverse=True)
    levels = np.array(CHANNEL_LEVELS, dtype=np.int64)
    # One key per (level, block, channel), all levels at once: level-major, then block, then channel.
    blocks = intervals[None, :] >> (2 * levels[:, None])
    keys = (levels[:, None] * (int(intervals.max()) + 1) + blocks) * len(channels) + codes[None, :]
    unique, at = np.unique(keys.ravel(), return_inverse=True)
    loss_summed = np.bincount(at, weights=np.tile(loss_sums, len(levels)))
    tokens_summed = np.bincount(at, weights=np.tile(tokens, len(levels)))
    level_block, channel_of = np.divmod(unique, len(channels))
    level_of, block_of = np.divmod(level_block, int(intervals.max()) + 1)
    return [
        (run_pk, level, block, channels[k], s, n)
        for level, block, k, s, n in zip(
            level_of.tolist(),
            block_of.tolist(),
            channel_of.tolist(),
            loss_summed.tolist(),
            tokens_summed.tolist(),
            strict=True,
        )
    ]


# -- level 0, grouped from the interval rows ---------------------------------------------------------
_LEVEL_0 = np.zeros(1, dtype=np.int64)


def level_0_blocks(rows: Sequence[Sequence[Any]], c: Coefficients) -> tuple[np.ndarray, np.ndarray]:
    """Level-0 blocks (one interval merged over its ranks) of interval rows given as READ_COLUMNS
    tuples sorted by interval, by ingest's own arithmetic: (the intervals, their block columns,
    BLOCK_INT_COLUMNS then BLOCK_FLOAT_COLUMNS, as floats with NaN for NULL). What the series
    reads instead of a stored level 0."""
    intervals, per_row = _per_row(np.array(rows, dtype=float).reshape(len(rows), len(READ_COLUMNS)), c)
    _, blocks, merged = _merge_levels(intervals, per_row, _LEVEL_0)
    return blocks, merged[:, _TABLE_ORDER]


# -- entry points ----------------------------------------------------------------------------------
_LEVELS = np.array(STORED_LEVELS, dtype=np.int64)


Writes = list[tuple[str, Sequence[Sequence[Any]]]]  # (table, rows to add), in the order written


def _rollup_writes(
    database: str,
    run_pk: int,
    rows: Sequence[Sequence[Any]],
    intervals: np.ndarray,
    per_row: np.ndarray,
    channels: Channels | None = None,
) -> Writes:
    writes: Writes = [("rollups", _table_rows(database, run_pk, *_merge_levels(intervals, per_row, _LEVELS)))]
    if not any(map(_TOKENS_GET, rows)):  # no row sent channel tokens (the usual batch): one C loop
        return writes
    channel_blocks = _channel_blocks(run_pk, rows, channels)
    if channel_blocks:
        writes.append(("channel_rollups", channel_blocks))
    return writes


def _totals_writes(run_pk: int, intervals: np.ndarray, per_row: np.ndarray, sync_sites: Mapping[str, int]) -> Writes:
    with np.errstate(over="ignore", invalid="ignore"):  # as _merge_levels' sums
        sums = per_row[:, 1:_LEAST_AT].sum(axis=0).tolist()
    totals = (run_pk, len(per_row), int(intervals.max()), int(per_row[:, _GREATEST_AT].max()), *sums)
    writes: Writes = [("run_totals", [totals])]
    if sync_sites:
        writes.append(("run_sync_sites", [(run_pk, site, n) for site, n in sorted(sync_sites.items())]))
    return writes


def _add_all(connection: Connection, writes: Writes) -> None:
    """The writes in order: on SQLite one executemany each; on PostgreSQL all in one statement
    (writes.add_together: one round trip instead of one per table)."""
    if connection.dialect.name == "sqlite":
        for table_name, rows in writes:
            if table_name in _TABLES:
                _add(connection, table_name, rows)
            elif rows:  # the rank summaries' and interval histograms' (writes.write's statement)
                write(connection, table_name, "add", rows)
    else:
        add_together(connection, writes)


# -- the run's first interval ----------------------------------------------------------------------
_FIRST_COLUMNS = tuple(run_first_interval.columns.keys())


@functools.cache
def _first_interval_upsert(database: str) -> str:
    """The run's first-interval row: a lower interval replaces the stored one, the same interval
    adds to it (steps widen), a later one leaves it; a row marked by migration 0016 (rows -1:
    summed by the reads) is replaced only by a lower interval. Every SET reads the stored row as
    it was, on both databases. Returns the row's interval and rows as they are now."""
    p = "?" if database == "sqlite" else "%s"
    least, greatest = ("min", "max") if database == "sqlite" else ("least", "greatest")
    t, ex = "run_first_interval", "excluded"
    lower, same = f'{ex}."interval" < {t}."interval"', f'{ex}."interval" = {t}."interval" AND {t}."rows" >= 0'

    def merged(name: str, how: str) -> str:
        return f'"{name}" = CASE WHEN {lower} THEN {ex}."{name}" WHEN {same} THEN {how} ELSE {t}."{name}" END'

    sets = [f'"interval" = CASE WHEN {lower} THEN {ex}."interval" ELSE {t}."interval" END']
    sets.append(merged("rows", f'{t}."rows" + {ex}."rows"'))
    sets.append(merged("first_step", f'{least}({t}."first_step", {ex}."first_step")'))
    sets.append(merged("last_step", f'{greatest}({t}."last_step", {ex}."last_step")'))
    sets += [merged(name, f'{t}."{name}" + {ex}."{name}"') for name in SUM_NAMES]
    columns = ", ".join(f'"{c}"' for c in _FIRST_COLUMNS)
    values = ", ".join([p] * len(_FIRST_COLUMNS))
    upsert = f"INSERT INTO {t} ({columns}) VALUES ({values}) ON CONFLICT (run_pk) DO UPDATE SET {', '.join(sets)}"
    return f'{upsert} RETURNING "interval", "rows"'


def _first_interval_row(run_pk: int, intervals: np.ndarray, per_row: np.ndarray) -> tuple[Any, ...]:
    """The new rows of the batch's lowest interval, summed: (run_pk, interval, rows, first and last
    step, SUM_NAMES)."""
    lowest = int(intervals.min())
    block = per_row[intervals == lowest]
    with np.errstate(over="ignore", invalid="ignore"):  # as _merge_levels' sums
        sums = block[:, _SUMS_AT].sum(axis=0).tolist()
    steps = int(block[:, _AT_GROUPED["first_step"]].min()), int(block[:, _AT_GROUPED["last_step"]].max())
    return (run_pk, lowest, len(block), *steps, *sums)


def store_aggregates(
    connection: Connection,
    run_pk: int,
    c: Coefficients,
    rows: Sequence[Sequence[Any]],
    sync_sites: Mapping[str, int],
    channels: Channels | None = None,
    also: Sequence[tuple[str, Sequence[Sequence[Any]]]] = (),
    *,
    lowest_sites: Mapping[str, int],
) -> None:
    """Add new interval rows (sorted by interval then rank) to everything kept at ingest. Keys are
    written in sorted order, table by table, so concurrent batches of one run lock rows in the
    same order and cannot deadlock. `sync_sites`: the rows' sites summed; `lowest_sites`: those
    of the rows of their lowest interval, kept should that be the run's first. `channels`: each
    row's (channel_loss, channel_tokens) as decoded, which ingest has at hand (else they are read
    from the rows' JSON text). `also`: other adding upserts of the batch (writes.write's tables:
    the rank summaries, the interval histograms), written with these, in PostgreSQL's one
    statement."""
    if not rows:
        return
    intervals, per_row = _per_row(_field_matrix(rows), c)
    writes = _rollup_writes(connection.dialect.name, run_pk, rows, intervals, per_row, channels)
    totals = _totals_writes(run_pk, intervals, per_row, sync_sites)
    _add_all(connection, writes + totals + list(also))
    if intervals[0] == intervals[-1]:  # one interval (a rank's own record): its sums are the totals row's
        _, whole, _, last_step, *sums = totals[0][1][0]
        first: Sequence[Any] = (run_pk, int(intervals[0]), whole, int(per_row[:, _AT_GROUPED["first_step"]].min()))
        first = (*first, last_step, *sums)
    else:
        first = _first_interval_row(run_pk, intervals, per_row)
    # The first interval's sites after its row, as the row says: the run's totals row, written
    # above in this transaction, holds the run's other batches off until it commits, so one batch
    # at a time writes them and sees the last one's.
    database = driver_of(connection)
    if database == "postgresql":  # one round trip
        sites = to_json(sorted(lowest_sites.items())).decode()
        run_sql(connection, _first_interval_with_sites(), (*first, run_pk, first[1], first[2], run_pk, sites, first[1]))
        return
    ((kept, kept_rows),) = run_sql(connection, _first_interval_upsert(database), first)
    if kept == first[1]:  # the batch's lowest interval is the run's first (for now)
        # The row holds this batch's rows alone: the run's first batch, or a lower interval
        # that replaced the kept one (whose sites go).
        if kept_rows == first[2]:
            run_sql(connection, 'DELETE FROM run_first_sync_sites WHERE run_pk = ? AND "interval" > ?', (run_pk, kept))
        if lowest_sites:
            rows = [(run_pk, kept, site, n) for site, n in sorted(lowest_sites.items())]
            write(connection, "run_first_sync_sites", "add", rows)


@functools.cache
def _first_interval_with_sites() -> str:
    """PostgreSQL: the first-interval upsert, then, where it left the batch's lowest interval the
    run's first, that interval's sites added (a JSON array of [site, count], sorted) and, where the
    row holds this batch's rows alone (the run's first batch, or a lower interval that replaced the
    kept one), the sites of higher intervals deleted; as SQLite's statements do one by one."""
    add = f"CASE WHEN s.count > {INT64_MAX} - excluded.count THEN {INT64_MAX} ELSE s.count + excluded.count END"
    return (
        f"WITH kept AS ({_first_interval_upsert('postgresql')}), "
        "dropped AS (DELETE FROM run_first_sync_sites d USING kept WHERE d.run_pk = %s "
        'AND d."interval" > kept."interval" AND kept."interval" = %s AND kept."rows" = %s), '
        'added AS (INSERT INTO run_first_sync_sites AS s (run_pk, "interval", site, count) '
        'SELECT %s, kept."interval", e.value ->> 0, CAST(e.value ->> 1 AS BIGINT) '
        'FROM kept, jsonb_array_elements(%s::JSONB) AS e WHERE kept."interval" = %s '
        f'ON CONFLICT (run_pk, "interval", site) DO UPDATE SET count = {add}) '
        'SELECT "interval", "rows" FROM kept'
    )
