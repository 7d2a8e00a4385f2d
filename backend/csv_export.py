"""The CSV export of a run: a header, then one row per stored interval with the catalogue's raw
fields and every derived metric, streamed in pieces so memory stays flat whatever the run's size."""

import csv
import io
from collections.abc import Iterator
from typing import Any

import numpy as np
from sqlalchemy import Select, String, cast, select
from sqlalchemy.orm import Session

from packscope.backend.columns import derive_columns, rows_with_nulls, sums_per_row
from packscope.backend.models import Run, intervals
from packscope.backend.queries import CSV_COLUMNS, CSV_DERIVED_COLUMNS, CSV_RAW_COLUMNS, coefficients
from packscope.backend.sql_formulas import metrics_of_row
from packscope.core.catalogue import SUM_FIELDS

CSV_CHUNK_ROWS = 2000  # rows per piece of the response: bounded memory, few round trips


def _csv_query(run: Run) -> Select[Any]:
    """The stored columns of CSV_RAW_COLUMNS, with channel_loss and channel_tokens as their stored JSON text."""
    return (
        select(
            *(
                cast(intervals.c[name], String) if name.startswith("channel_") else intervals.c[name]
                for name in CSV_RAW_COLUMNS
            )
        )
        .where(intervals.c.run_pk == run.id)
        .order_by(intervals.c.interval, intervals.c.rank)
    )


def csv_text(session: Session, run: Run) -> Iterator[str]:
    """The run's CSV (a header, then one row per stored interval), in pieces of about
    CSV_CHUNK_ROWS rows, read from the database as they are sent."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(CSV_COLUMNS)
    yield buffer.getvalue()
    if session.get_bind().dialect.name == "postgresql":
        yield from _csv_by_copy(session, run)
    else:
        yield from _csv_by_chunks(session, run)


def _csv_by_copy(session: Session, run: Run) -> Iterator[str]:
    """PostgreSQL computes the derived columns (the catalogue's formulas as SQL) and formats every
    row itself (COPY … TO STDOUT): no Python work per value."""
    derived = metrics_of_row(intervals, coefficients(run), CSV_DERIVED_COLUMNS).values()
    query = _csv_query(run).add_columns(*derived)
    sql = str(query.compile(dialect=session.get_bind().dialect, compile_kwargs={"literal_binds": True}))
    cursor = session.connection().connection.driver_connection.cursor()  # type: ignore[union-attr]
    cursor.execute("SET LOCAL extra_float_digits = 1")  # shortest exact floats, whatever the server's default
    with cursor.copy(f"COPY ({sql}) TO STDOUT WITH (FORMAT csv)") as copy:
        pieces: list[bytes] = []
        for row in copy:  # one row per message
            pieces.append(bytes(row))
            if len(pieces) == CSV_CHUNK_ROWS:
                yield b"".join(pieces).decode()
                pieces.clear()
        yield b"".join(pieces).decode()


def _csv_by_chunks(session: Session, run: Run) -> Iterator[str]:
    """Rows streamed from a server-side cursor; the derived columns computed per chunk with numpy,
    each chunk formatted by csv.writer."""
    c = coefficients(run)
    result = session.execute(_csv_query(run), execution_options={"stream_results": True, "yield_per": CSV_CHUNK_ROWS})
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    for chunk in result.partitions():
        values = dict(zip(CSV_RAW_COLUMNS, zip(*chunk, strict=True), strict=True))
        sums = sums_per_row({name: np.array(values[name], dtype=float) for name in SUM_FIELDS})  # None -> NaN
        derived = derive_columns(sums, c, CSV_DERIVED_COLUMNS)
        per_row = rows_with_nulls(np.column_stack([derived[name] for name in CSV_DERIVED_COLUMNS]))
        writer.writerows([*row, *extra] for row, extra in zip(chunk, per_row, strict=True))
        yield buffer.getvalue()
        buffer.seek(0)
        buffer.truncate()
