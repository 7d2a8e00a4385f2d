"""One definition, several evaluators: the catalogue's formulas on Python floats (derive), on
numpy columns (backend.columns) and as SQL (backend.sql_formulas) give the same numbers."""

import math
import random

import numpy as np
import pytest
from sqlalchemy import create_engine, insert, select

from packscope.backend.columns import derive_columns, sums_per_row
from packscope.backend.models import Base, intervals
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
    return (a is None and b is None) or (a is not None and b is not None and a == pytest.approx(b, rel=1e-15))


def test_numpy_columns_equal_derive_row_by_row():
    rows = random_rows(500)
    columns = {f.name: np.array([r[f.name] for r in rows], dtype=float) for f in FIELDS}
    derived = derive_columns(sums_per_row(columns), C)
    for i, row in enumerate(rows):
        want = derive(sums_of_rows([row]), C)
        for name in METRIC:
            got = derived[name][i]
            assert same(None if math.isnan(got) else float(got), want[name]), (name, i)


def test_sql_expressions_equal_derive_row_by_row(tmp_path):
    rows = random_rows(200, seed=1)
    engine = create_engine(f"sqlite:///{tmp_path / 'f.db'}")
    Base.metadata.create_all(engine)
    try:
        with engine.begin() as connection:
            connection.execute(insert(intervals), [{**r, "run_pk": 1} for r in rows])
            metrics = metrics_of_row(intervals, C, METRIC).values()
            query = select(intervals.c.interval, *metrics).order_by(intervals.c.interval)
            got_rows = connection.execute(query).all()
        for row, got in zip(rows, got_rows, strict=True):
            want = derive(sums_of_rows([row]), C)
            for name in METRIC:
                assert same(got._mapping[name], want[name]), (name, row["interval"])
    finally:
        engine.dispose()
