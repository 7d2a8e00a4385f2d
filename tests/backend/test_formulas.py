"""One definition, several evaluators: the catalogue's formulas on Python floats (derive) and on
numpy columns (backend.columns) give the same numbers. (The CSV export's float8 SQL is held to
Python floats cell by cell in test_csv_export.py.)"""

import math
import random

import numpy as np

from packscope.backend.formulas.columns import derive_columns, sums_per_row
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


def test_the_sums_a_run_reads_are_all_its_formulas_read():
    """formulas/sums_read.py: for a text model without windows none of the window, chunk, vision or
    audio sums; with them, those too (an audio tower's: those its coefficients price). Every metric
    is the same, bit for bit, with the sums it does not name made NaN (what a series that does not
    merge them holds)."""
    from packscope.backend.formulas.sums_read import sums_read
    from packscope.core.catalogue import SUM_NAMES
    from packscope.core.vision import VISION_SUMS

    text = C
    windowed = Coefficients(c_lin=1_234_567, c_core=89, peak_tflops=989.0, c_window=13, c_chunk=7)
    vision = Coefficients(
        c_lin=1_234_567, c_core=89, peak_tflops=None, c_window=13, c_vision=tuple((name, 3) for name in VISION_SUMS)
    )
    audio = Coefficients(
        c_lin=1_234_567, c_core=89, peak_tflops=989.0, c_audio=(("audio_positions", 5), ("audio_calls", 2))
    )
    assert not {n for n in sums_read(text) if n.startswith(("window_", "chunk_", "vision_", "audio_"))}
    assert {"window_sq_sum_bshd", "window_sq_sum_thd", "chunk_sq_sum_bshd", "chunk_sq_sum_thd"} <= sums_read(windowed)
    assert set(VISION_SUMS) <= sums_read(vision)
    assert {n for n in sums_read(audio) if n.startswith("audio_")} == {"audio_positions", "audio_calls"}
    rng = random.Random(3)
    for c in (text, windowed, vision, audio):
        sums = {name: rng.uniform(1, 1e6) for name in SUM_NAMES}
        partial = {name: value if name in sums_read(c) else math.nan for name, value in sums.items()}
        full, kept = derive(sums, c), derive(partial, c)
        assert all(same(full[name], kept[name]) for name in METRIC), c


def test_the_sums_of_a_field_matrix_are_each_sums_own_value_bit_for_bit():
    """columns.sums_matrix evaluates every SUM at once; each column must be what Sum.value gives on
    columns (and on Python floats, row by row): missing readings, leader sums on ranks other than
    0, products past the largest double, zeros of either sign."""
    from packscope.backend.formulas.columns import NUMPY_OPS, sums_matrix
    from packscope.core.catalogue import FLOAT_OPS, SUMS

    rng = np.random.default_rng(7)
    names = sorted({name for s in SUMS for name in s.reads})
    n = 400
    fields = rng.uniform(-1e3, 1e3, size=(n, len(names)))
    fields[rng.random((n, len(names))) < 0.1] = np.nan
    fields[rng.random((n, len(names))) < 0.05] = 1e200  # 1e200 * 1e200 is inf
    fields[rng.random((n, len(names))) < 0.05] = -0.0
    fields[:, names.index("rank")] = rng.integers(0, 4, n)
    got = sums_matrix(fields, {name: i for i, name in enumerate(names)})
    columns = {name: fields[:, i] for i, name in enumerate(names)}
    with np.errstate(over="ignore", invalid="ignore"):
        for j, s in enumerate(SUMS):
            want = np.asarray(s.value(columns, NUMPY_OPS), dtype=float)
            assert np.array_equal(got[:, j], want, equal_nan=True), s.name
            assert np.array_equal(np.signbit(got[:, j]), np.signbit(want)), s.name
    for i in range(0, n, 37):  # Python floats, a missing reading as None
        row = {name: (None if math.isnan(v) else float(v)) for name, v in zip(names, fields[i], strict=True)}
        for j, s in enumerate(SUMS):
            if all(row[name] is not None for name in s.of) or (s.present and row[s.present] is None):
                assert same(float(got[i, j]) if not math.isnan(got[i, j]) else None, s.value(row, FLOAT_OPS)), (
                    s.name,
                    i,
                )
