"""One definition, several evaluators: the catalogue's formulas on Python floats (derive), on
numpy columns (backend.columns) and as SQL (backend.sql_formulas) give the same numbers."""

import math
import random

import numpy as np
from sqlalchemy import Column, MetaData, Table, create_engine, insert, select

from packscope.backend.columns import derive_columns, sums_per_row
from packscope.backend.models import intervals
from packscope.backend.sql_formulas import metrics_of_row
from packscope.core.catalogue import FIELD, FIELDS, METRIC, Coefficients, derive, sums_of_rows

C = Coefficients(c_lin=1_234_567, c_core=89, peak_tflops=989.0)


def random_rows(n, seed=0):
    """Interval rows with zeros and missing readings, so that undefined metrics occur too."""
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        row = {f.name: (rng.randint(0, 10**6) if f.kind == "int" else rng.uniform(0, 100)) for f in FIELDS}
        row.update(interval=i, rank=0, steps=rng.randint(1, 20), gpus=rng.randint(1, 8))
        for name in ("loss", "gpu_util_pct", "gpu_power_w", "gpu_energy_j", "gpu_time_s", "tokens"):
            if rng.random() < 0.2:
                row[name] = 0 if FIELD[name].required else None
        rows.append(row)
    return rows


def same(a, b):
    """The same double, bit for bit (both None where undefined): every evaluator does the same
    IEEE operations in the same order."""
    return (a is None and b is None) or (
        a is not None and b is not None and math.copysign(1, a) == math.copysign(1, b) and a == b
    )


def test_numpy_columns_equal_derive_row_by_row():
    rows = random_rows(500)
    columns = {f.name: np.array([r[f.name] for r in rows], dtype=float) for f in FIELDS}
    derived = derive_columns(sums_per_row(columns), C)
    for i, row in enumerate(rows):
        want = derive(sums_of_rows([row]), C)
        for name in METRIC:
            got = derived[name][i]
            assert same(None if math.isnan(got) else float(got), want[name]), (name, i)


def test_sql_expressions_equal_derive_row_by_row(database_url):
    """On SQLite and PostgreSQL: float8 arithmetic throughout (on PostgreSQL a division used to
    go through NUMERIC, which rounded the divisor and differed in the last digits)."""
    rows = random_rows(200, seed=1)
    # Digits that a 15-significant-digit NUMERIC cannot hold: gpu_time_s = 1/3·k, c_lin odd.
    for i, row in enumerate(rows):
        row["gpu_time_s"] = (i + 1) / 3 if row["gpu_time_s"] else 0.0
    # The intervals table's columns and types, without its foreign key to runs.
    table = Table("formula_rows", MetaData(), *(Column(col.name, col.type) for col in intervals.columns))
    engine = create_engine(database_url)
    table.metadata.create_all(engine)
    try:
        with engine.begin() as connection:
            connection.execute(insert(table), [{**r, "run_pk": 1} for r in rows])
            metrics = metrics_of_row(table, C, METRIC).values()
            query = select(table.c.interval, *metrics).order_by(table.c.interval)
            got_rows = connection.execute(query).all()
        for row, got in zip(rows, got_rows, strict=True):
            want = derive(sums_of_rows([row]), C)
            for name in METRIC:
                assert same(got._mapping[name], want[name]), (name, row["interval"], got._mapping[name], want[name])
    finally:
        engine.dispose()
