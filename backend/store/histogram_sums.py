"""Per interval, its length histograms summed over the ranks that sent it, kept at ingest: the
length heatmap and the bar view read one row an interval, however many ranks (issue 39).

The rows here are written with the batch's other aggregates (store/aggregates.py, writes.py's
adding upsert: counts add and saturate at INT64_MAX, steps widen), so records of an interval may
come in any order, from any server process. Only rows new to the database come here
(ingest/batches.py), so a replayed record adds nothing.
"""

from collections.abc import Sequence
from typing import Any

from packscope.backend.store.models import COLUMN_AT

_INTERVAL, _FIRST, _LAST = COLUMN_AT["interval"], COLUMN_AT["first_step"], COLUMN_AT["last_step"]


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
