"""Rollups, run totals and run sync sites of a set of new interval rows, aggregated with numpy and
upserted (adding) once per touched key: what the reads answer from without scanning intervals."""

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from sqlalchemy import Connection

from packscope.backend.columns import BAND_COLUMNS, derive_columns, merge_blocks, rows_with_nulls, sums_per_row
from packscope.backend.models import ROLLUP_LEVELS
from packscope.backend.rows import COLUMN_AT, FIELD_SLICE, ROW_COLUMNS
from packscope.backend.writes import write
from packscope.core.catalogue import BAND_METRICS, SUM_NAMES, Coefficients


def _per_row_blocks(rows: Sequence[Sequence[Any]], c: Coefficients) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(interval, int columns, float columns) of each row as its own block: its sums, and its band
    metrics as both the min and the max."""
    fields = np.array([row[FIELD_SLICE] for row in rows], dtype=float)  # None -> NaN
    by_name = {name: fields[:, i] for i, name in enumerate(ROW_COLUMNS[FIELD_SLICE])}
    sums = sums_per_row(by_name)
    rates = derive_columns(sums, c, BAND_METRICS)
    floats = np.column_stack([sums[n] for n in SUM_NAMES] + [rates[n.rsplit("_", 1)[0]] for n in BAND_COLUMNS])
    steps = [(1, row[COLUMN_AT["first_step"]], row[COLUMN_AT["last_step"]]) for row in rows]
    return (
        np.array([row[COLUMN_AT["interval"]] for row in rows], dtype=np.int64),
        np.array(steps, dtype=np.int64),
        floats,
    )


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
    write(connection, "rollups", "add", blocks)
    # The top level covers every new row once.
    last_interval = max(row[COLUMN_AT["interval"]] for row in rows)
    sums = floats[:, : len(SUM_NAMES)].sum(axis=0).tolist()
    totals = (run_pk, int(ints[:, 0].sum()), last_interval, int(ints[:, 2].max()), *sums)
    write(connection, "run_totals", "add", [totals])
    if sync_sites:
        sites = [(run_pk, site, n) for site, n in sorted(sync_sites.items())]
        write(connection, "run_sync_sites", "add", sites)
