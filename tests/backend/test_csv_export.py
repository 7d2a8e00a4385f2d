"""The CSV export, cell by cell: every cell of a randomized multi-rank run against an independent
computation from the posted records, on SQLite and PostgreSQL, and the same text from both.

Raw fields are compared verbatim (integers as digits, floats as the shortest digits that read back
exactly, laid out as PostgreSQL's float8out does: docs/api.md), derived metrics are the
catalogue's formulas evaluated in plain Python floats on the record's own sums, NULL and undefined
values are empty cells, and the channel columns are the stored JSON text.
"""

import csv
import io
import json
import math
import random
from decimal import Decimal
from typing import Any

import numpy as np
import pytest

from packscope.backend.formulas import number_text
from packscope.backend.reads import csv_export
from packscope.backend.reads.csv_export import CSV_COLUMNS, CSV_DERIVED_COLUMNS
from packscope.core.catalogue import FIELDS, FLOAT_OPS, SUMS, Coefficients, evaluate

RUNS = "/api/v1/runs"


def shortest(x: float) -> str:
    """x as PostgreSQL writes a float8 (extra_float_digits > 0), built here from Python's repr
    (the same shortest digits for every value these tests use); None and NaN are empty cells."""
    if x is None or math.isnan(x):
        return ""
    if x == 0:
        return "-0" if math.copysign(1, x) < 0 else "0"
    sign, digits, exponent = Decimal(repr(x)).normalize().as_tuple()
    text = "".join(map(str, digits))
    point = len(text) + int(exponent) - 1  # decimal exponent of the first digit
    if -4 <= point < 15:
        if point < 0:
            body = "0." + "0" * (-point - 1) + text
        elif len(text) <= point + 1:
            body = text + "0" * (point + 1 - len(text))
        else:
            body = text[: point + 1] + "." + text[point + 1 :]
    else:
        body = text[0] + ("." + text[1:] if len(text) > 1 else "") + f"e{'-' if point < 0 else '+'}{abs(point):02d}"
    return ("-" if sign else "") + body


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (650.0, "650"),
        (0.25, "0.25"),
        (1e-4, "0.0001"),
        (1.5e-5, "1.5e-05"),
        (123456789012345.6, "123456789012345.6"),
        (1e15, "1e+15"),
        (2.5e300, "2.5e+300"),
        (-0.0, "-0"),
        (0.1 + 0.2, "0.30000000000000004"),
        (1700000000.0, "1700000000"),
    ],
)
def test_the_float_layout(value, text):
    assert shortest(value) == text
    assert number_text.float_text(value) == text
    cells = number_text.float_cells(np.array([value, math.nan]))
    assert [bytes(row).replace(b"\0", b"").decode() for row in cells] == [text, ""]


def test_vectorized_floats_equal_the_reference_for_every_magnitude():
    rng = np.random.default_rng(3)
    x = np.concatenate(
        [
            rng.integers(0, 2**64, 20_000, dtype=np.uint64).view(np.float64),  # any bit pattern
            10.0 ** rng.uniform(-8, 20, 20_000),
            rng.uniform(-3, 3, 20_000),
            np.round(rng.uniform(0, 1000, 5_000), 2),
            rng.integers(-(2**60), 2**60, 5_000).astype(float),
            np.ldexp(1.0, rng.integers(-1074, 1024, 2_000)),
            np.nextafter(10.0 ** rng.integers(-30, 30, 2_000), np.inf),
            [0.0, -0.0, math.nan, math.inf, -math.inf, 5e-324, 1.7976931348623157e308],
        ]
    )
    got = [bytes(row).replace(b"\0", b"").decode() for row in number_text.float_cells(x)]
    assert got == [number_text.float_text(v) for v in x.tolist()]


def test_arrow_floats_equal_the_reference_for_every_magnitude():
    """float_strings (Arrow's shortest digits where its layout is float8out's, the numpy code
    elsewhere) writes what float_text writes, at and around every bound between the two."""
    rng = np.random.default_rng(6)
    bounds = np.array([1e-10, 1e-9, 1e-6, 1e-5, 1e-4, 1e9, 1e10, 1e14, 1e15, 1e16, 2.0**54, 2.0**62, 1e100, 1e-100])
    x = np.concatenate(
        [
            rng.integers(0, 2**64, 50_000, dtype=np.uint64).view(np.float64),  # any bit pattern
            10.0 ** rng.uniform(-12, 20, 50_000),
            np.round(rng.uniform(0, 1000, 5_000), 2),
            rng.integers(-(2**60), 2**60, 5_000).astype(float),
            # Whole numbers in fixed notation past Arrow's (int64 digits), and beside them fractions.
            np.round(rng.uniform(-1e15, 1e15, 5_000)),
            rng.uniform(1e10, 1e15, 5_000),
            # Integers past 2^54 (_big_integer_strings), many of them with a shortest decimal exactly
            # halfway to a neighbour (a small power of two times a 53-bit significand).
            rng.uniform(2.0**54, 2.0**62, 20_000) * rng.choice([-1.0, 1.0], 20_000),
            np.ldexp(rng.integers(2**52, 2**53, 20_000).astype(float), rng.integers(2, 18, 20_000)),
            np.ldexp(1.0, np.arange(54, 64)),
            bounds,
            -bounds,
            np.nextafter(bounds, 0),
            np.nextafter(bounds, np.inf),
            [0.0, -0.0, math.nan, math.inf, -math.inf, 5e-324, 1.7976931348623157e308],
        ]
    )
    got = number_text.float_strings(x).to_pylist()
    assert got == [number_text.float_text(v) or None for v in x.tolist()]  # an empty cell is null


@pytest.mark.parametrize("low", [0.0, 1e-9, 1e-4, 1.0, 1e9])
def test_arrow_floats_of_plain_columns_equal_the_reference(low):
    """A column without magnitudes that Arrow writes otherwise (float_strings' early return)."""
    rng = np.random.default_rng(7)
    top = {0.0: 1e-4, 1e-9: 1e-4, 1e-4: 1.0, 1.0: 1e9, 1e9: 1e10}[low]
    x = np.concatenate([rng.uniform(low, top, 20_000), -rng.uniform(low, top, 100), [0.0, -0.0, math.nan, low]])
    if low == 0.0:
        x = np.concatenate([x * 1e-6, [5e-324, 1e-300, 9.99e-10]])  # below 1e-9: Arrow's exponents are float8out's
    got = number_text.float_strings(x).to_pylist()
    assert got == [number_text.float_text(v) or None for v in x.tolist()]


@pytest.mark.parametrize(
    "texts",
    [
        [None, None],
        ['{"code":1.5}', None, '{"web, en":2}', "", "\\.", "\\.x", 'a"b', "a\nb", "a\rb", "plain", "é,ü"],
        # Every cell holds a quote (JSON objects with keys): quoted without the per-cell checks.
        ['{"code":1.5}', None, '{"web, en":2}', '"', '""', 'a"b\nc', '{"ü":"x,y"}'],
    ],
)
def test_arrow_channel_cells_equal_the_reference(texts):
    import pyarrow as pa

    got = csv_export.channel_cells(pa.array(texts, pa.string())).to_pylist()
    assert [g or "" for g in got] == [csv_export._channel_cell(t) for t in texts]


def test_digit_rows_are_the_decimal_digits():
    rng = np.random.default_rng(5)
    left = np.concatenate(
        [
            rng.integers(10**16, 10**17, 20_000),
            np.array([10**16, 10**17 - 1, 10**16 + 1, 99_999_999 * 10**9, 10**16 + 999_999_999, 12345678 * 10**9]),
        ]
    )
    for rows in (1, 8, 9, 17, 19):
        got = number_text._digit_rows(left, rows).T
        want = [f"{v:017d}"[:rows].ljust(rows, "0") for v in left.tolist()]
        assert [bytes(row).decode() for row in got] == want, rows


@pytest.mark.parametrize(
    "column",
    [
        [math.nan] * 5,  # a whole column NULL
        [math.nan, 2.5, math.nan, 3.5, 1.25],  # one layout, some NULL
        [math.nan, 2.5e-7, 1e20, 0.0, -0.0, -3.0, math.nan],  # every layout, zeros and NULL
        [1e-300, math.nan, 5e-324, 1e300, 2.2250738585072014e-308],  # outside the fast range
    ],
)
def test_null_cells_are_empty_whatever_the_rest_of_the_column(column):
    cells = number_text.float_cells(np.array(column))
    assert [bytes(row).replace(b"\0", b"").decode() for row in cells] == [number_text.float_text(v) for v in column]


@pytest.mark.postgres
def test_the_reference_equals_postgresql_float8out(postgres):
    import psycopg

    rng = np.random.default_rng(4)
    x = np.concatenate(
        [
            rng.integers(0, 2**64, 50_000, dtype=np.uint64).view(np.float64),
            10.0 ** rng.uniform(-8, 20, 20_000),
            # Integers past 2^54 whose shortest decimal lies exactly halfway to a neighbour:
            # PostgreSQL writes one more digit there than Python's repr.
            np.ldexp(rng.integers(2**52, 2**53, 20_000).astype(float), rng.integers(2, 18, 20_000)),
        ]
    )
    values = [v for v in x.tolist() if math.isfinite(v)]
    with psycopg.connect(postgres.replace("postgresql+psycopg://", "postgresql://")) as conn:
        conn.execute("SET extra_float_digits = 1")
        written = [r[0] for r in conn.execute("SELECT v::text FROM unnest(%s::float8[]) AS v", (values,))]
    assert [number_text.float_text(v) for v in values] == written


def _records(make: Any, seed: int) -> list[dict[str, Any]]:
    """Three ranks over 40 intervals (one rank starts late, one skips intervals), with optional
    readings missing at random, zero GPU time (undefined rates) and channel columns of all kinds;
    `make` is the `records` fixture (conftest's plausible records)."""
    rng = random.Random(seed)
    out = []
    for rank, gpus in ((0, 8), (1, 2), (2, 1)):
        for interval in range(40):
            if (rank == 1 and interval < 10) or (rank == 2 and interval % 3 == 1):
                continue
            (r,) = make(1, start=interval, seed=rng.randrange(2**32), gpus=gpus, rank=rank)
            r["wall_start"] += rng.uniform(0, 1)
            r["wall_end"] = r["wall_start"] + rng.uniform(0.5, 100)
            if rng.random() < 0.3:
                r["loss"] = None
            if rng.random() < 0.3:
                r["lr"] = None
            if rng.random() < 0.3:
                r["grad_norm"] = None
            if rng.random() < 0.1:
                r["gpu_time_s"] = 0.0
            if rng.random() < 0.5:  # the ledger's measurements (an older agent's records lack them)
                r.update(data_wait_s=rng.uniform(0, 0.1), data_wait_gaps=r["steps"] - 1)
            if rng.random() < 0.3:
                r.update(traced_steps=3, traced_step_time_s=0.3, traced_busy_s=rng.uniform(0.1, 0.3))
                r.update(sync_idle_s=rng.uniform(0, 0.05), launch_idle_s=rng.uniform(0, 0.05))
                if rng.random() < 0.5:  # the syncs' idle between the traced steps (a later agent's)
                    r.update(traced_gaps=2, sync_idle_between_s=rng.uniform(0, 0.02))
            if rng.random() < 0.6:
                gpu = {
                    "util_pct": rng.choice([rng.uniform(0, 100), 100.0, None]),
                    "power_w": rng.choice([rng.uniform(50, 700), 650.0, None]),
                    "sm_clock_mhz": rng.choice([1980.0, None]),
                    "mem_used_bytes": rng.choice([float(rng.randint(0, 2**37)), None]),
                    "energy_j": rng.choice([rng.uniform(0, 1e5), 0.0, None]),
                }
                r["gpu"] = gpu
            kind = rng.random()
            if kind < 0.6:
                names = rng.sample(["code", "web, en", 'say "hi"', "ünï", "math"], rng.randint(0, 3))
                r["channel_loss"] = {n: rng.choice([rng.uniform(0.5, 4), 2.0]) for n in names}
                r["channel_tokens"] = {n: rng.randint(0, 10**6) for n in names}
            elif kind < 0.8:
                r["channel_loss"] = {"code": rng.uniform(1, 3)}  # older agents: no channel_tokens
            out.append(r)
    rng.shuffle(out)
    return out


def _wire(record: dict[str, Any], field: Any) -> Any:
    value: Any = record
    for key in field.wire_path:
        value = None if value is None else value.get(key)
    return field.default if value is None and field.default is not None else value  # absent: its default


def _expected_rows(records: list[dict[str, Any]], c: Coefficients) -> list[list[str]]:
    rows = []
    for r in sorted(records, key=lambda r: (r["interval"], r["rank"])):
        channels = [
            "" if r.get(name) is None else json.dumps(r[name], sort_keys=True)
            for name in ("channel_loss", "channel_tokens")
        ]
        rows.append(_expected_cells({f.name: _wire(r, f) for f in FIELDS}, channels, c))
    return rows


def _expected_cells(fields: dict[str, Any], channels: list[str], c: Coefficients) -> list[str]:
    """One row's cells from its stored fields (column name -> value) and channel cells."""
    raw = [
        ("" if v is None else str(v)) if f.kind == "int" else shortest(v)  # a NULL count: an empty cell
        for f, v in zip(FIELDS, fields.values(), strict=True)
    ]
    # The catalogue's sums of this one row, as floats (the formulas' own rule), then its formulas
    # in Python floats (IEEE doubles: an overflow is inf, an empty cell; an underflow 0).
    as_floats = {name: None if v is None else float(v) for name, v in fields.items()}
    sums = {s.name: float(s.value(as_floats, FLOAT_OPS)) for s in SUMS}
    derived = evaluate(sums, c, FLOAT_OPS, CSV_DERIVED_COLUMNS)
    return raw + channels + [shortest(v) if math.isfinite(v) else "" for v in derived.values()]


def _post_run(client, new_run, records, peak):
    body = new_run()
    body["hardware"] = {"gpu_name": "H200", "gpu_count": 8, "peak_tflops": peak}
    assert client.post(RUNS, json=body).status_code == 201
    for start in range(0, len(records), 50):
        response = client.post(f"{RUNS}/run-1/intervals", json={"intervals": records[start : start + 50]})
        assert response.status_code == 200, response.text
        assert response.json()["accepted"] == len(records[start : start + 50])
    return Coefficients.for_run(body["model"], body["hardware"])


@pytest.mark.parametrize("peak", [989.0, None])
def test_every_cell_equals_an_independent_computation(database_url, make_client, new_run, records, monkeypatch, peak):
    monkeypatch.setattr(csv_export, "CSV_CHUNK_ROWS", 7)  # many pieces, the last one short
    records = _records(records, seed=5)
    client = make_client(database_url)
    c = _post_run(client, new_run, records, peak)
    response = client.get(f"{RUNS}/run-1/intervals.csv")
    assert response.status_code == 200
    text = response.text
    assert text.endswith("\n") and "\r" not in text
    header, *rows = list(csv.reader(io.StringIO(text)))
    assert header == list(CSV_COLUMNS)
    want = _expected_rows(records, c)
    assert len(rows) == len(want) == len(records)
    for got, expected in zip(rows, want, strict=True):
        for name, g, w in zip(CSV_COLUMNS, got, expected, strict=True):
            assert g == w, (name, got[:2], g, w)
    # Every kind of cell was exercised.
    at = {name: i for i, name in enumerate(CSV_COLUMNS)}
    kinds = ("loss", "gpu_util_pct", "gpu_energy_j", "channel_loss", "channel_tokens", "tflops_thd", "data_wait_gaps")
    for name in kinds:
        assert any(row[at[name]] == "" for row in rows) and any(row[at[name]] != "" for row in rows), name
    assert any(row[at["mfu_thd"]] != "" for row in rows) == (peak is not None)


def test_held_columns_are_read_again_where_a_value_changes(sqlite_url, make_client, new_run, records, monkeypatch):
    """SQLite's chunks check a column that held one value through the previous chunk instead of
    reading it (csv_export._sqlite_chunks); a chunk where the value changes (a number to another,
    NULL to a number and back, a channel's text) reads those columns after all. Every cell stays
    the independently computed one."""
    monkeypatch.setattr(csv_export, "CSV_CHUNK_ROWS", 6)
    queries: list[tuple[Any, ...]] = []
    sqlite_query = csv_export._sqlite_query
    monkeypatch.setattr(csv_export, "_sqlite_query", lambda *args: queries.append(args) or sqlite_query(*args))
    rs = records(40, seed=3)
    for i, r in enumerate(rs):
        r["lr"] = 3e-4 if i < 9 else 1e-4  # held through the first chunk, changes inside the second
        r["loss"] = 2.5 if 20 <= i < 31 else None  # NULL, a value, NULL again
        r["gpu"] = None if i < 14 else {"util_pct": 100.0 - (i >= 33), "power_w": 650.0}
        r["channel_loss"] = {"code": 1.5} if i < 27 else {"code, web": 2.0}  # quoted from row 27 on
    client = make_client(sqlite_url)
    c = _post_run(client, new_run, rs, 989.0)
    _, *rows = list(csv.reader(io.StringIO(client.get(f"{RUNS}/run-1/intervals.csv").text)))
    assert rows == _expected_rows(rs, c)
    held = [args for args in queries if args[2]]  # (run_pk, columns, held, after)
    assert held and all("lr" not in args[1] for args in held[:1]), "the second chunk checks lr"
    assert any(args[1] == held[0][2] for args in queries), "a chunk read its held columns after all"


@pytest.mark.postgres
def test_sqlite_and_postgresql_write_the_same_text(sqlite_url, postgres, make_client, new_run, records, monkeypatch):
    monkeypatch.setattr(csv_export, "CSV_CHUNK_ROWS", 5)
    records = _records(records, seed=6)
    texts = []
    for url in (sqlite_url, postgres):
        client = make_client(url)
        _post_run(client, new_run, records, 989.0)
        texts.append(client.get(f"{RUNS}/run-1/intervals.csv").text)
    assert texts[0] == texts[1]
    assert texts[0].count("\n") == len(records) + 1


def test_an_empty_run_is_its_header(client, new_run):
    assert client.post(RUNS, json=new_run()).status_code == 201
    assert client.get(f"{RUNS}/run-1/intervals.csv").text == ",".join(CSV_COLUMNS) + "\n"


def _extreme_records(make: Any) -> list[dict[str, Any]]:
    """Records with stored values at the edges of what the record accepts (magnitudes 0 or from
    1e-300 to 1e300), where a derived rate overflows (to inf: an empty cell) or underflows (to 0
    or a subnormal) in IEEE doubles, and a plain record between them; PostgreSQL's float8
    arithmetic raises on both. (Stored values below 1e-300, which only a direct insert makes, are
    test_corner_values_inside_and_outside_the_safe_range's.)"""
    edits: list[dict[str, Any]] = [
        {"gpu_time_s": 1e-300},  # tokens / GPU-seconds overflows
        {"gpu_time_s": 1e300, "gpus": 2**31 - 1},  # GPU-seconds overflows: rates are 0
        {"gpu_time_s": 1e-300, "steps": 7},  # the smallest magnitude stored: step time near the subnormals
        {"gpu": {"energy_j": 1e-300, "power_w": 1e300, "util_pct": 100.0}},  # energy per token near them
        {"gpu": {"energy_j": 1e300, "power_w": 1e-300}, "loss": -1e300, "lr": -1e300, "grad_norm": 1e300},
        {"gpu_time_s": 0.0, "gpu": {"energy_j": 0.0}},  # 0/0: empty cells
        {"host_time_s": 1e300, "step_time_max_s": 1e300, "wall_end": 1e300, "gpu": {"mem_used_bytes": 1e300}},
        {"wall_start": -1e300, "loss": 1e-300, "gpu_time_s": 1e-100},  # just inside PostgreSQL's range
        {"gpu_time_s": 9.99e-101},  # just outside it
        {},
    ]
    out = []
    for i, edit in enumerate(edits):
        (r,) = make(1, start=i, seed=i)
        gpu = edit.pop("gpu", None)
        r.update(edit)
        if gpu is not None:
            r["gpu"] = {**(r.get("gpu") or {}), **gpu}
        if r["syncs"].get("uncounted_steps"):  # an interval whose syncs went uncounted: all its steps
            r["syncs"]["uncounted_steps"] = r["steps"]
        out.append(r)
    return out


@pytest.mark.parametrize("peak", [989.0, 1e-300, 1e9])
def test_extreme_stored_values_export_like_ieee_doubles(database_url, make_client, new_run, records, peak):
    """Every value the schema accepts exports: a derived metric that overflows is an empty cell
    (as inf is on SQLite), one that underflows is 0 or a subnormal, on both databases; the
    stream is never cut short. (PostgreSQL raised 'value out of range' mid-stream before.)"""
    records = _extreme_records(records)
    client = make_client(database_url)
    c = _post_run(client, new_run, records, peak)
    response = client.get(f"{RUNS}/run-1/intervals.csv")
    assert response.status_code == 200
    header, *rows = list(csv.reader(io.StringIO(response.text)))
    assert header == list(CSV_COLUMNS)
    want = _expected_rows(records, c)
    assert len(rows) == len(want)
    for got, expected in zip(rows, want, strict=True):
        for name, g, w in zip(CSV_COLUMNS, got, expected, strict=True):
            assert g == w, (name, got[:2], g, w)
    at = {name: i for i, name in enumerate(CSV_COLUMNS)}
    cells = [row[at[name]] for row in rows for name in CSV_DERIVED_COLUMNS]
    assert "" in cells and "0" in cells  # overflows and underflows were met


@pytest.mark.postgres
def test_extreme_values_same_text_on_both_databases(sqlite_url, postgres, make_client, new_run, records):
    texts = []
    for url in (sqlite_url, postgres):
        client = make_client(url)
        _post_run(client, new_run, _extreme_records(records), 989.0)
        texts.append(client.get(f"{RUNS}/run-1/intervals.csv").text)
    assert texts[0] == texts[1]


def _corner_rows(seed: int) -> list[dict[str, Any]]:
    """Stored rows (column name -> value) whose fields the formulas read take values at the
    corners of what each column accepts and of PostgreSQL's safe range (csv_export._FLOAT_RANGES),
    inside and just outside it, in random combinations; the other fields plain."""
    low, high = getattr(csv_export, "_FLOAT_RANGES", ((1e-100, 1e100),))[0]
    float_corners = [0.0, low, high, low * 0.999, high * 1.001, 5e-324, 2.2250738585072014e-308, 1e300, 1.5]
    int_corners = {"steps": [1, 2**31 - 1], "gpus": [1, 2**31 - 1]}
    rng = random.Random(seed)
    rows = []
    for i in range(300):
        row: dict[str, Any] = {f.name: (1 if f.kind == "int" else 1.0) for f in FIELDS}
        row.update(interval=i, rank=0, first_step=i, last_step=i)
        for name in ("tokens", "real_tokens", "seqlen_sq_sum_bshd", "seqlen_sq_sum_thd", "syncs_total"):
            row[name] = rng.choice([0, 1, 12345, 2**63 - 1])
        for name, choices in int_corners.items():
            row[name] = rng.choice(choices)
        row["gpu_time_s"] = rng.choice(float_corners)
        row["gpu_energy_j"] = rng.choice([None, *float_corners])
        row["loss"] = rng.choice([None, -1e300, 5e-324, 2.5])
        rows.append(row)
    return rows


@pytest.mark.parametrize("peak", [989.0, 1e-9, 1e9])
def test_corner_values_inside_and_outside_the_safe_range(database_url, make_client, new_run, peak):
    """Rows stored straight into the table (no cross-field checks) with each formula input at
    its corners: PostgreSQL computes the rows inside its safe range without raising, the others
    are made again, and every cell equals the computation in Python floats."""
    from sqlalchemy import create_engine, insert, select

    from packscope.backend.store.models import Run, intervals

    client = make_client(database_url)
    body = new_run()
    body["hardware"] = {"gpu_name": "H200", "gpu_count": 8, "peak_tflops": peak}
    assert client.post(RUNS, json=body).status_code == 201
    c = Coefficients.for_run(body["model"], body["hardware"])
    rows = _corner_rows(seed=int(peak) % 97)
    engine = create_engine(database_url)
    try:
        with engine.begin() as connection:
            run_pk = connection.execute(select(Run.id)).scalar_one()
            connection.execute(insert(intervals), [{**r, "run_pk": run_pk} for r in rows])
    finally:
        engine.dispose()
    response = client.get(f"{RUNS}/run-1/intervals.csv")
    assert response.status_code == 200
    header, *got = list(csv.reader(io.StringIO(response.text)))
    assert header == list(CSV_COLUMNS)
    want = [_expected_cells(r, ["", ""], c) for r in rows]
    assert len(got) == len(want)
    for g_row, w_row in zip(got, want, strict=True):
        for name, g, w in zip(CSV_COLUMNS, g_row, w_row, strict=True):
            assert g == w, (name, g_row[0], g, w)


@pytest.mark.postgres
def test_copy_rows_equal_psycopgs_own_reading_and_raise_its_errors(postgres):
    """csv_export._copy_rows gives one row per message: the same rows as psycopg's iteration, in
    order, whatever the sizes, the connection usable after, and an error the server sends
    mid-COPY raised (the export must fail loudly, never end as if complete)."""
    import psycopg

    dsn = postgres.replace("postgresql+psycopg://", "postgresql://")
    query = (
        "COPY (SELECT g, repeat('x', g % 700), g * 0.5 FROM generate_series(1, 30000) g) TO STDOUT WITH (FORMAT csv)"
    )
    with psycopg.connect(dsn) as conn:
        with conn.cursor().copy(query) as copy:
            want = [bytes(row) for row in copy]
        with conn.cursor().copy(query) as copy:
            got = list(csv_export._copy_rows(copy))
        assert got == want and len(got) == 30000
        conn.execute("SELECT 1")  # the connection is usable afterwards
    with psycopg.connect(dsn) as conn:
        failing = "COPY (SELECT 1 / (g - 20000) FROM generate_series(1, 30000) g) TO STDOUT"
        with pytest.raises(psycopg.Error, match="division by zero"), conn.cursor().copy(failing) as copy:
            for _ in csv_export._copy_rows(copy):
                pass
