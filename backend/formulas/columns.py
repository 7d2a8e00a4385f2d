"""The catalogue's definitions evaluated on numpy columns: one value per interval row, per rollup
block or per chart bucket at once, instead of a Python call per window.

Missing optional readings are NaN in the field columns; undefined metrics (0/0, an unknown peak,
an overflow) are NaN in the metric columns and None once listed.
"""

import functools
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from packscope.core.catalogue import BAND_METRICS, SUM_NAMES, SUMS, Coefficients, evaluate

Columns = Mapping[str, np.ndarray]


class NumpyOps:
    """Formulas on float arrays: a division by 0 is NaN; a missing reading is NaN."""

    @staticmethod
    def ratio(num: Any, den: Any) -> np.ndarray:
        # Called inside derive_columns' np.errstate (x/0 warns nowhere); where() picks NaN there.
        return np.where(np.not_equal(den, 0), np.true_divide(num, den), np.nan)

    @staticmethod
    def unless_missing(reading: np.ndarray, value: Callable[[], np.ndarray]) -> np.ndarray:
        return np.where(np.isnan(reading), 0.0, value())

    @staticmethod
    def if_leader(rank: np.ndarray, value: np.ndarray) -> np.ndarray:
        return np.where(rank == 0, value, 0.0)


NUMPY_OPS = NumpyOps()


class _SumsPlan:
    """catalogue.Sum.value for every SUM at once, on a float matrix of the fields (one column per
    field, NaN where a reading is missing): a handful of whole-matrix operations instead of a few
    per SUM, which on a batch of 64 rows cost more in numpy's per-call overhead than in arithmetic.
    The same IEEE operations in the same order as Sum.value: the product of `of` from left to
    right, then 0 where `present` is missing, then 0 on a rank other than 0 for a leader sum."""

    def __init__(self, at: Mapping[str, int]) -> None:
        depth = max(len(s.of) for s in SUMS)
        # factors[k]: (the sums with a k-th factor, that factor's column)
        self.factors = [
            (
                np.array([j for j, s in enumerate(SUMS) if len(s.of) > k]),
                np.array([at[s.of[k]] for s in SUMS if len(s.of) > k]),
            )
            for k in range(depth)
        ]
        self.present = (
            np.array([j for j, s in enumerate(SUMS) if s.present]),
            np.array([at[s.present] for s in SUMS if s.present]),
        )
        self.leader = np.array([j for j, s in enumerate(SUMS) if s.leader])
        self.rank = at.get("rank")
        assert len(self.factors[0][0]) == len(SUMS), "every SUM has a first factor"
        assert self.rank is not None or not len(self.leader), "a leader sum reads the rank"

    def __call__(self, fields: np.ndarray) -> np.ndarray:
        out = fields[:, self.factors[0][1]]
        with np.errstate(over="ignore", invalid="ignore"):  # a product past 1.8e308 is inf, as in Python
            for sums, columns in self.factors[1:]:
                out[:, sums] *= fields[:, columns]
        sums, columns = self.present
        if len(sums):
            out[:, sums] = np.where(np.isnan(fields[:, columns]), 0.0, out[:, sums])
        if len(self.leader):
            out[:, self.leader] = np.where((fields[:, self.rank] == 0)[:, None], out[:, self.leader], 0.0)
        return out


@functools.cache
def _plan(at: tuple[tuple[str, int], ...]) -> _SumsPlan:
    return _SumsPlan(dict(at))


def sums_matrix(fields: np.ndarray, at: Mapping[str, int]) -> np.ndarray:
    """Each row's contribution to every SUM (catalogue.Sum.value), one column per SUM in SUMS
    order, from the rows' fields as a float matrix (`at`: each field the sums read -> its column)."""
    return _plan(tuple(at.items()))(fields)


_READ = tuple(sorted({name for s in SUMS for name in s.reads}))
_READ_AT = {name: i for i, name in enumerate(_READ)}


def sums_per_row(fields: Columns) -> dict[str, np.ndarray]:
    """Each row's contribution to every SUM, from the fields as columns (name -> column)."""
    matrix = sums_matrix(np.column_stack([np.asarray(fields[name], dtype=float) for name in _READ]), _READ_AT)
    return {name: matrix[:, j] for j, name in enumerate(SUM_NAMES)}


def derive_columns(sums: Columns, c: Coefficients, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Every (or the named) metric for each row of `sums` (SUM name -> column); NaN where undefined."""
    length = len(sums[SUM_NAMES[0]])
    out = {}
    with np.errstate(over="ignore", invalid="ignore", divide="ignore"):
        for name, value in evaluate(sums, c, NUMPY_OPS, names).items():
            value = np.asarray(value, dtype=float)
            if value.shape != (length,):  # a formula of constants only
                value = np.broadcast_to(value, (length,))
            out[name] = np.where(np.isfinite(value), value, np.nan)
    return out


def listed(column: np.ndarray) -> list[float | None]:
    """A float column as a list, None where it is NaN (JSON null, SQL NULL, an empty CSV cell).
    Flat, with no list per row: a series's thousand one-element lists per column, alive together,
    were most of the objects it left for the collector's older generations."""
    values = column.astype(object)
    values[np.isnan(column)] = None
    return values.tolist()


# A rollup block (or a chart bucket): its exact integer columns and its float columns, in the
# rollups table's order. Merging blocks adds counts and sums and widens steps, bands and the
# wall-clock extent (every `*_min` / `*_max` column).
BAND_COLUMNS = tuple(f"{name}_{end}" for name in BAND_METRICS for end in ("min", "max"))
# The wall-clock extent of a block: (its column, the interval field it is the least / greatest of).
WALL_EXTENTS = (("wall_start_min", "wall_start"), ("wall_end_max", "wall_end"))
WALL_COLUMNS = tuple(column for column, _ in WALL_EXTENTS)
BLOCK_INT_COLUMNS = ("rows", "first_step", "last_step")
BLOCK_FLOAT_COLUMNS = (*SUM_NAMES, *BAND_COLUMNS, *WALL_COLUMNS)


def merged_by(name: str) -> str:
    """How an aggregate column (rollups, run totals) merges over blocks: "min" for the lower ends
    (first step, band minima, wall-clock start), "max" for the upper ends, "sum" for counts and
    sums. The upserts at ingest (writes.adding), merge_blocks and the series' SQL merge all ask this."""
    if name.endswith("_min") or name == "first_step":
        return "min"
    if name.endswith("_max") or name in ("last_step", "last_interval"):
        return "max"
    return "sum"


_ADD_AT = [i for i, name in enumerate(BLOCK_FLOAT_COLUMNS) if merged_by(name) == "sum"]
_MIN_AT = [i for i, name in enumerate(BLOCK_FLOAT_COLUMNS) if merged_by(name) == "min"]
_MAX_AT = [i for i, name in enumerate(BLOCK_FLOAT_COLUMNS) if merged_by(name) == "max"]
assert list(range(len(SUM_NAMES))) == _ADD_AT, "the block's sums lead its float columns"
assert [merged_by(name) for name in BLOCK_INT_COLUMNS] == ["sum", "min", "max"], "merge_blocks' int columns"


Blocks = tuple[np.ndarray, np.ndarray, np.ndarray]  # (keys, int columns, float columns)


def merge_blocks(keys: np.ndarray, ints: np.ndarray, floats: np.ndarray) -> Blocks:
    """Blocks with equal keys (sorted, so equal keys are adjacent) merged into one each."""
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    merged_ints = np.column_stack(
        [
            np.add.reduceat(ints[:, 0], starts),
            np.minimum.reduceat(ints[:, 1], starts),
            np.maximum.reduceat(ints[:, 2], starts),
        ]
    )
    merged = np.empty((len(starts), floats.shape[1]))
    with np.errstate(over="ignore", invalid="ignore"):  # sums past 1.8e308 are inf, as in Python
        merged[:, _ADD_AT] = np.add.reduceat(floats[:, _ADD_AT], starts)
    merged[:, _MIN_AT] = np.fmin.reduceat(floats[:, _MIN_AT], starts)  # fmin/fmax skip NaN (undefined, unknown)
    merged[:, _MAX_AT] = np.fmax.reduceat(floats[:, _MAX_AT], starts)
    return keys[starts], merged_ints, merged
