"""The catalogue's definitions evaluated on numpy columns: one value per interval row, per rollup
block or per chart bucket at once, instead of a Python call per window.

Missing optional readings are NaN in the field columns; undefined metrics (0/0, an unknown peak,
an overflow) are NaN in the metric columns and None once listed.
"""

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from packscope.core.catalogue import SUM_NAMES, SUMS, Coefficients, evaluate

Columns = Mapping[str, np.ndarray]


class NumpyOps:
    """Formulas on float arrays: a division by 0 is NaN."""

    @staticmethod
    def ratio(num: Any, den: Any) -> np.ndarray:
        num, den = np.broadcast_arrays(np.asarray(num, dtype=float), np.asarray(den, dtype=float))
        return np.divide(num, den, out=np.full(num.shape, np.nan), where=den != 0)


NUMPY_OPS = NumpyOps()


def sums_per_row(fields: Columns) -> dict[str, np.ndarray]:
    """Each row's contribution to every SUM: the product of its fields, 0 where `present` is missing."""
    out = {}
    for s in SUMS:
        value = fields[s.of[0]]
        for name in s.of[1:]:
            value = value * fields[name]
        if s.present is not None:
            value = np.where(np.isnan(fields[s.present]), 0.0, value)
        out[s.name] = value
    return out


def derive_columns(sums: Columns, c: Coefficients, names: Iterable[str] | None = None) -> dict[str, np.ndarray]:
    """Every (or the named) metric for each row of `sums` (SUM name -> column); NaN where undefined."""
    length = len(sums[SUM_NAMES[0]])
    out = {}
    with np.errstate(over="ignore", invalid="ignore"):
        for name, value in evaluate(sums, c, NUMPY_OPS, names).items():
            value = np.broadcast_to(np.asarray(value, dtype=float), (length,))
            out[name] = np.where(np.isfinite(value), value, np.nan)
    return out


def listed(column: np.ndarray) -> list[float | None]:
    """A float column as a list, None where it is NaN (JSON null, SQL NULL, an empty CSV cell)."""
    values = column.astype(object)
    values[np.isnan(column)] = None
    return values.tolist()  # type: ignore[no-any-return]
