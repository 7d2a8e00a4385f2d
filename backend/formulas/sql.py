"""The catalogue's formulas as PostgreSQL float8 SQL (the CSV's derived columns, computed by the
database), and the bounds analysis that says for which stored values that SQL cannot raise."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

from packscope.core.catalogue import FIELDS, Coefficients, Sum, evaluate


class Sql:
    """A float8 SQL expression: the catalogue's formulas evaluated on these build the SQL text
    with the same operations, in the same order, as numpy evaluates them (no NUMERIC casts)."""

    def __init__(self, text: str) -> None:
        self.text = text

    @staticmethod
    def of(value: Any) -> Sql:
        return value if isinstance(value, Sql) else Sql(f"'{float(value)!r}'::float8")

    def _op(self, op: str, other: Any, reflected: bool = False) -> Sql:
        a, b = (Sql.of(other), self) if reflected else (self, Sql.of(other))
        return Sql(f"({a.text} {op} {b.text})")

    # Each operator and its reflection, as SQL text in the order the operands came.
    __add__, __radd__ = functools.partialmethod(_op, "+"), functools.partialmethod(_op, "+", reflected=True)
    __sub__, __rsub__ = functools.partialmethod(_op, "-"), functools.partialmethod(_op, "-", reflected=True)
    __mul__, __rmul__ = functools.partialmethod(_op, "*"), functools.partialmethod(_op, "*", reflected=True)
    __truediv__ = functools.partialmethod(_op, "/")
    __rtruediv__ = functools.partialmethod(_op, "/", reflected=True)


class SqlColumn(Sql):
    """A stored column as a formula reads it (`text`, which may screen its value), keeping the
    column's name for the tests on the stored value itself (NULL, rank 0)."""

    def __init__(self, text: str, column: str) -> None:
        super().__init__(text)
        self.column = column


class SqlOps:
    """A division by 0 is NULL, and NULL stays NULL (an empty cell), as NaN does in numpy."""

    @staticmethod
    def ratio(num: Any, den: Any) -> Sql:
        return Sql(f"({Sql.of(num).text} / NULLIF({Sql.of(den).text}, 0))")

    @staticmethod
    def unless_missing(reading: SqlColumn, value: Callable[[], Any]) -> Sql:
        return Sql(f"(CASE WHEN {reading.column} IS NULL THEN 0::float8 ELSE {Sql.of(value()).text} END)")

    @staticmethod
    def if_leader(rank: SqlColumn, value: Any) -> Sql:
        return Sql(f"(CASE WHEN {rank.column} = 0 THEN {Sql.of(value).text} ELSE 0::float8 END)")


# Every intermediate value of the derived columns must stay inside these magnitudes for
# PostgreSQL to compute a row: float8 arithmetic there raises on overflow and on underflow to 0
# (numpy and the CSV's SQLite path return inf or 0 and go on). Rows whose stored values could leave
# them are computed by the SQLite path's numpy code instead (reads/csv_export._recompute), so both write the same.
SAFE_LOW, SAFE_HIGH = 1e-300, 1e300
# The stored floats a row may hold (besides 0 and NULL) for PostgreSQL to compute it: the widest
# of these that Bound's analysis proves safe for the run's coefficients.
FLOAT_RANGES = ((1e-100, 1e100), (1e-30, 1e30), (1e-8, 1e8))


class Bound:
    """Bounds on |x| over the nonzero values x an expression can take (0 never overflows nor
    underflows); `bad` once any intermediate value may leave [SAFE_LOW, SAFE_HIGH]."""

    def __init__(self, low: float, high: float, bad: bool = False) -> None:
        self.low, self.high = low, high
        self.bad = bad or (high > 0 and not (low >= SAFE_LOW and high <= SAFE_HIGH))

    @staticmethod
    def of(value: Any) -> Bound:
        if isinstance(value, Bound):
            return value
        a = abs(float(value))
        return Bound(a, a) if a else NO_VALUE

    def _mul(self, o: Bound) -> Bound:
        if self.high == 0 or o.high == 0:
            return Bound(math.inf, 0.0, self.bad or o.bad)
        return Bound(self.low * o.low, self.high * o.high, self.bad or o.bad)

    def _div(self, o: Bound) -> Bound:
        if o.high == 0 or self.high == 0:  # x / NULL is NULL, 0 / x is 0: nothing to check
            return Bound(math.inf, 0.0, self.bad or o.bad)
        if o.low == 0:
            return Bound(0.0, math.inf, True)
        return Bound(self.low / o.high, self.high / o.low, self.bad or o.bad)

    def _add(self, o: Bound) -> Bound:
        # A nonzero sum or difference of two doubles is at least the smaller one's spacing.
        return Bound(min(self.low, o.low) * 2.0**-53, self.high + o.high, self.bad or o.bad)

    def __add__(self, o: Any) -> Bound:
        return self._add(Bound.of(o))

    __radd__ = __sub__ = __rsub__ = __add__

    def __mul__(self, o: Any) -> Bound:
        return self._mul(Bound.of(o))

    __rmul__ = __mul__

    def __truediv__(self, o: Any) -> Bound:
        return self._div(Bound.of(o))

    def __rtruediv__(self, o: Any) -> Bound:
        return Bound.of(o)._div(self)


NO_VALUE = Bound(math.inf, 0.0)  # an expression that is always 0 or NULL


class BoundOps:
    @staticmethod
    def ratio(num: Any, den: Any) -> Bound:
        return Bound.of(num) / Bound.of(den)

    @staticmethod
    def unless_missing(reading: Any, value: Callable[[], Any]) -> Any:
        return value()  # or 0, which is always safe

    @staticmethod
    def if_leader(rank: Any, value: Any) -> Any:
        return value


FLOAT_FIELDS = frozenset(f.name for f in FIELDS if f.kind == "float")


def float_range(c: Coefficients, sums: list[Sum], names: Sequence[str]) -> tuple[float, float] | None:
    """The widest of FLOAT_RANGES over which PostgreSQL computes the metrics `names` of a row
    without leaving [SAFE_LOW, SAFE_HIGH], or None when even the narrowest is not safe."""
    for low, high in FLOAT_RANGES:
        fields = {f.name: Bound(low, min(high, f.upper)) if f.kind == "float" else Bound(1.0, f.upper) for f in FIELDS}
        bounds = {s.name: Bound.of(s.value(fields, BoundOps())) for s in sums}
        if not any(Bound.of(v).bad for v in evaluate(bounds, c, BoundOps(), names).values()):
            return low, high
    return None
