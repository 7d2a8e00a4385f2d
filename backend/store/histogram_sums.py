"""Per interval, its length histograms summed over the ranks that sent it, kept at ingest: the
length heatmap and the bar view read one row an interval, however many ranks (issue 39).

An upsert that adds (counts saturate at INT64_MAX, as every integer aggregate), steps widen; so
records of an interval may come in any order, from any server process. Only rows new to the
database come here (ingest/batches.py), so a replayed record adds nothing.
"""

import functools
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Connection
from sqlalchemy.dialects import postgresql, sqlite

from packscope.backend.store.db import run_sql
from packscope.backend.store.models import COLUMN_AT, interval_histogram_sums
from packscope.backend.store.writes import DRIVER_DIALECTS, adding, driver_of

_INTERVAL, _FIRST, _LAST = COLUMN_AT["interval"], COLUMN_AT["first_step"], COLUMN_AT["last_step"]


@functools.cache
def _upsert(database: str) -> str:
    table = interval_histogram_sums
    stmt: Any = (postgresql.insert if database == "postgresql" else sqlite.insert)(table)
    key = [c.name for c in table.primary_key.columns]
    stmt = stmt.on_conflict_do_update(index_elements=key, set_=adding(stmt, table, key, database))
    columns = list(table.columns.keys())
    compiled = stmt.compile(dialect=DRIVER_DIALECTS[database](), column_keys=columns)
    assert list(compiled.positiontup or ()) == columns, compiled.positiontup
    return str(compiled)


def interval_sums(run_pk: int, rows: Sequence[Sequence[Any]], counts: Sequence[Sequence[int]]) -> list[tuple[Any, ...]]:
    """The interval_histogram_sums rows (table order, key order) that the interval rows (ROW_COLUMNS
    tuples) with their histograms' numbers (HISTOGRAM_COLUMNS order) add."""
    per: dict[int, list[Any]] = {}
    for row, numbers in zip(rows, counts, strict=True):
        interval = int(row[_INTERVAL])
        kept = per.get(interval)
        if kept is None:
            per[interval] = [1, int(row[_FIRST]), int(row[_LAST]), *numbers]
            continue
        kept[0] += 1
        kept[1] = min(kept[1], int(row[_FIRST]))
        kept[2] = max(kept[2], int(row[_LAST]))
        for at, n in enumerate(numbers, 3):
            kept[at] += n
    return [(run_pk, i, *per[i]) for i in sorted(per)]


def store_histogram_sums(
    connection: Connection, run_pk: int, rows: Sequence[Sequence[Any]], counts: Sequence[Sequence[int]]
) -> None:
    """Add new interval rows' histograms to their intervals' sums, in the batch's transaction."""
    if rows:
        run_sql(connection, _upsert(driver_of(connection)), interval_sums(run_pk, rows, counts), many=True)
