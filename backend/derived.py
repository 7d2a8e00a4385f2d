"""The catalogue's sums and per-interval rates as SQL expressions.

The formulas themselves live in packscope.core (flops_triad, catalogue.METRICS); this module only
says how to compute the catalogue's SUMS in SQL, so that a chart bucket or a run aggregates in the
database and packscope.core.catalogue.derive turns the sums into every shown number.
"""

from typing import Any

from sqlalchemy import ColumnElement, Float, cast, func

from packscope.core.catalogue import FIELD, SUMS, Coefficients
from packscope.core.flops import flops_triad


def _as_float(column: Any) -> Any:
    # S2 and T·c_lin sums pass 2^63 over a long run (SQLite's integer SUM would raise); rates need
    # no exact integers.
    return cast(column, Float) if FIELD[column.name].kind == "int" else column


def sum_expressions(cols: Any) -> dict[str, ColumnElement[Any]]:
    """SQL aggregates over interval rows (`cols`: a table's or subquery's columns), named as catalogue.SUMS."""
    out: dict[str, ColumnElement[Any]] = {}
    for s in SUMS:
        product = _as_float(getattr(cols, s.of[0]))
        for name in s.of[1:]:
            product = product * _as_float(getattr(cols, name))
        total = func.sum(product)
        if s.present is not None:
            total = total.filter(getattr(cols, s.present).is_not(None))
        out[s.name] = func.coalesce(total, 0.0)
    return out


def interval_rate_expressions(cols: Any, c: Coefficients) -> dict[str, ColumnElement[Any]]:
    """Per-interval rates as SQL expressions, for the MIN/MAX band of a chart bucket."""
    f = lambda name: cast(getattr(cols, name), Float)  # noqa: E731 - a local shorthand
    triad = flops_triad(
        f("tokens"), f("real_tokens"), f("seqlen_sq_sum_bshd"), f("seqlen_sq_sum_thd"), float(c.c_lin), float(c.c_core)
    )
    gpu_seconds = func.nullif(cols.gpu_time_s * cols.gpus, 0.0)
    out = {f"tflops_{kind}": flops / gpu_seconds / 1e12 for kind, flops in triad.items()}
    out["step_time_s"] = cols.gpu_time_s / cols.steps
    return out
