"""The catalogue's definitions evaluated as SQL expressions over the `intervals` columns: one
interval row's metrics computed by the database, for exports that the database also formats
(PostgreSQL's COPY … TO STDOUT).

Every field is cast to a float first, so the database computes in IEEE doubles as numpy and
Python do; a division by 0 is NULL (x / NULLIF(den, 0)) and NULL stays NULL.
"""

from collections.abc import Iterable, Mapping
from typing import Any

from sqlalchemy import ColumnElement, Float, Table, case, cast, func

from packscope.core.catalogue import SUMS, Coefficients, evaluate


class SqlOps:
    """Formulas as SQL expressions: a division by 0 is NULL."""

    @staticmethod
    def ratio(num: Any, den: Any) -> ColumnElement[Any]:
        return num / func.nullif(den, 0.0)


SQL_OPS = SqlOps()


def sums_of_row(table: Table) -> dict[str, ColumnElement[Any]]:
    """Each SUM of one row of `table`: the product of its fields, 0 where `present` is missing."""
    out = {}
    for s in SUMS:
        value: ColumnElement[Any] = cast(table.c[s.of[0]], Float)
        for name in s.of[1:]:
            value = value * cast(table.c[name], Float)
        if s.present is not None:
            value = case((table.c[s.present].is_(None), 0.0), else_=value)
        out[s.name] = value
    return out


def metrics_of_row(table: Table, c: Coefficients, names: Iterable[str]) -> Mapping[str, ColumnElement[Any]]:
    """The named metrics of one row of `table`, labelled by name; NULL where undefined."""
    return {name: value.label(name) for name, value in evaluate(sums_of_row(table), c, SQL_OPS, names).items()}
