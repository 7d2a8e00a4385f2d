"""The catalogue's definitions evaluated as SQL expressions over the `intervals` columns: one
interval row's metrics computed by the database.

Every field and constant is a double (``DOUBLE PRECISION``, float8 on PostgreSQL, REAL on
SQLite) and every operation float8 arithmetic, the same IEEE operations in the same order as the
catalogue's Python and numpy evaluators, so the database gives the same doubles. A division by 0
is NULL (x / NULLIF(den, 0)) and NULL stays NULL. (Until 2026-11-30 a division went through
NUMERIC on PostgreSQL: SQLAlchemy casts an untyped divisor there, which was slower and rounded.)

PostgreSQL raises where a double overflows or underflows to 0, which values near the schema's
bounds can make happen; the CSV export (backend/csv_export.py) guards against that itself.
"""

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import ColumnElement, Double, Table, case, cast, func, literal

from packscope.core.catalogue import SUMS, Coefficients, evaluate


def _double(value: Any) -> ColumnElement[Any]:
    """A constant as a bound double (exact, never a decimal literal the database re-reads)."""
    return value if isinstance(value, ColumnElement) else literal(float(value), Double)


class SqlOps:
    """Formulas as SQL expressions: a division by 0 is NULL, every operand a double."""

    @staticmethod
    def ratio(num: Any, den: Any) -> ColumnElement[Any]:
        return _double(num) / func.nullif(_double(den), literal(0.0, Double), type_=Double)


SQL_OPS = SqlOps()


def sums_of_row(table: Table) -> dict[str, ColumnElement[Any]]:
    """Each SUM of one row of `table`: the product of its fields, 0 where `present` is missing."""
    out = {}
    for s in SUMS:
        value: ColumnElement[Any] = cast(table.c[s.of[0]], Double)
        for name in s.of[1:]:
            value = value * cast(table.c[name], Double)
        if s.present is not None:
            value = case((table.c[s.present].is_(None), literal(0.0, Double)), else_=value)
        out[s.name] = value
    return out


def metrics_of_row(table: Table, c: Coefficients, names: Iterable[str]) -> Mapping[str, ColumnElement[Any]]:
    """The named metrics of one row of `table`, labelled by name; NULL where undefined."""
    return {name: _double(value).label(name) for name, value in evaluate(sums_of_row(table), c, SQL_OPS, names).items()}
