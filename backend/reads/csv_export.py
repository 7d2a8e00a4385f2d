"""The CSV export of a run: a header, then one row per stored interval with the catalogue's raw
fields and every derived metric, streamed in pieces so memory stays flat whatever the run's size.

Both databases write the same text. Numbers are written as PostgreSQL writes them (float8out,
backend/formulas/number_text.py); NULL (and an undefined metric, and one that overflows a double) is an
empty cell; one that underflows is 0 or a subnormal, as IEEE doubles give it. channel_loss and
channel_tokens are their stored JSON text, quoted as CSV quotes it (when it holds a comma, a quote
or a line break).

* PostgreSQL computes the derived columns (the catalogue's formulas as float8 SQL, each sum once
  per row) and formats every row itself (``COPY … TO STDOUT``): no Python work per value. Its
  float8 arithmetic raises where IEEE doubles overflow or underflow to 0, so it computes only
  rows whose stored floats lie in a range proven safe for the run (formulas/sql.py, in practice
  every real row); any other row comes back marked and is made again by the SQLite path's code.
* SQLite: columns are read in chunks through the raw sqlite3 cursor (a statement a chunk, keyed
  by (interval, rank); a column that held one value through the previous chunk is checked in
  SQL instead of read, as sqlite3 hands out each cell as a Python object), the chunk's row tuples
  become Arrow columns (one conversion in compiled code), the derived columns are computed per
  chunk with numpy (backend/formulas/columns.py, the same IEEE operations in the same order as the SQL),
  and every column becomes a string array in compiled code: Arrow's shortest float digits where
  its layout is float8out's, the vectorized digit search elsewhere (backend/formulas/number_text.py); Arrow
  then joins the cells row-wise. pyarrow is a server dependency for this
  (docs/benchmarks/2026-11-30-2core.md#dev-2026-11-30-1706-csv-third-pass).
"""

from __future__ import annotations

import functools
import math
import sqlite3
from collections.abc import Iterator
from typing import Any, NamedTuple

import numpy as np
import psycopg
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs, no py.typed
import pyarrow.compute as pc  # type: ignore[import-untyped]
from sqlalchemy.orm import Session

from packscope.backend.formulas.columns import derive_columns, sums_per_row
from packscope.backend.formulas.number_text import float_strings
from packscope.backend.formulas.sql import FLOAT_FIELDS, Bound, BoundOps, Sql, SqlColumn, SqlOps, float_range
from packscope.backend.formulas.sums_read import ReadSums
from packscope.backend.store.models import Run
from packscope.backend.store.runs import coefficients
from packscope.core.catalogue import (
    FIELD,
    FIELDS,
    METRICS,
    SUM_FIELDS,
    SUMS,
    Coefficients,
    WindowSums,
    evaluate,
    flops_count,
)
from packscope.core.flops import TRIAD

# The CSV: every stored column of the catalogue, then every derived metric of the interval.
CSV_RAW_COLUMNS = (*(f.name for f in FIELDS), "channel_loss", "channel_tokens")
CSV_DERIVED_COLUMNS = tuple(m.name for m in METRICS if m.name not in CSV_RAW_COLUMNS)
CSV_COLUMNS = CSV_RAW_COLUMNS + CSV_DERIVED_COLUMNS

_STRING = pa.string()
CSV_CHUNK_ROWS = 10_000  # rows per piece of the response: bounded memory (a few MB), few round trips
_COPY_PIECE_ROWS = 2000  # PostgreSQL's pieces: nothing to amortize per piece, smaller buffers are cheaper
_CHANNELS = ("channel_loss", "channel_tokens")
_NUMERIC = tuple(name for name in CSV_RAW_COLUMNS if name not in _CHANNELS)
# The CSV's raw columns are the numeric fields, then the two channel columns, then the derived ones.
assert (*_NUMERIC, *_CHANNELS) == CSV_RAW_COLUMNS, "csv_export assumes the channel columns end the raw ones"


def csv_bytes(session: Session, run: Run) -> Iterator[bytes | memoryview]:
    """The run's CSV (a header, then one row per stored interval) as UTF-8, in pieces of about
    CSV_CHUNK_ROWS rows, read from the database as they are sent. A piece is bytes or a view of
    the buffer it was built in (never copied into a str and back: for a piece of a few MB, that
    cost CPU on every row; docs/benchmarks/2026-12-03-2core.md#dev-2026-12-03-night)."""
    yield (",".join(CSV_COLUMNS) + "\n").encode()  # plain names: nothing to quote
    if session.get_bind().dialect.name == "postgresql":
        yield from _csv_by_copy(session, run)
    else:
        yield from _csv_by_chunks(session, run)


# -- PostgreSQL -----------------------------------------------------------------------------------
def _copy_sql(run_pk: int, c: Coefficients) -> str:
    """COPY's query: the raw cells, then the derived columns as float8 SQL. A stored float
    outside the range proven safe reads as NaN in the formulas (nothing can raise), and such a
    row's last cell is the control character U+0001 (the last column is otherwise a float8
    written as text, or NULL, and the channels' JSON escapes control characters): one memchr per
    piece tells _csv_by_copy whether a row of it must be made again."""
    uses = ReadSums(Bound(1.0, 1.0))
    evaluate(uses, c, BoundOps(), CSV_DERIVED_COLUMNS)
    sums = [s for s in SUMS if s.name in uses.read]
    safe = float_range(c, sums, CSV_DERIVED_COLUMNS)
    order = f"FROM intervals WHERE run_pk = {int(run_pk)} ORDER BY interval, rank"
    raw = [f"{name}::text AS {name}" if name in _CHANNELS else name for name in CSV_RAW_COLUMNS]
    if safe is None:  # no row is computed here
        derived = ["NULL::float8"] * (len(CSV_DERIVED_COLUMNS) - 1) + ["chr(1)"]
        return f"SELECT {', '.join(raw + derived)} {order}"
    in_range = f"BETWEEN {safe[0]!r} AND {safe[1]!r}"
    floats = sorted({name for s in sums for name in s.of if name in FLOAT_FIELDS}, key=CSV_RAW_COLUMNS.index)
    # A stored float outside the safe range reads as NaN, so nothing in the formulas can raise.
    fields = {
        name: SqlColumn(
            f"(CASE WHEN abs({name}) {in_range} OR {name} = 0 THEN {name}::float8 ELSE 'NaN'::float8 END)"
            if name in FLOAT_FIELDS
            else f"{name}::float8",
            name,
        )
        for name in {name for s in sums for name in s.reads}
    }
    # Each sum and each FLOPs count once per row, in a subquery (OFFSET 0 keeps the planner from
    # folding its columns back into every formula that reads them), which hands the derived
    # columns its values by name: the same float8 operations in the same order, not repeated.
    refs = {s.name: Sql.of(s.value(fields, SqlOps())) for s in sums}
    counts = {kind: Sql.of(flops_count(kind, refs, c)) for kind in TRIAD}
    inner = [*raw, *(f"{ref.text} AS s_{name}" for name, ref in refs.items())]
    inner += [f"{count.text} AS f_{kind}" for kind, count in counts.items()]
    named = WindowSums({name: Sql(f"s_{name}") for name in refs})
    named.flops.update({kind: Sql(f"f_{kind}") for kind in counts})
    derived = [Sql.of(v).text for v in evaluate(named, c, SqlOps(), CSV_DERIVED_COLUMNS).values()]
    if floats:
        ok = " AND ".join(f"(abs({name}) {in_range} OR {name} = 0 OR {name} IS NULL)" for name in floats)
        inner.append(f"({ok}) AS in_range")
        derived[-1] = f"CASE WHEN in_range THEN ({derived[-1]})::text ELSE chr(1) END"
    return f"SELECT {', '.join((*CSV_RAW_COLUMNS, *derived))} FROM (SELECT {', '.join(inner)} {order} OFFSET 0) AS r"


def _csv_by_copy(session: Session, run: Run) -> Iterator[bytes]:
    c = coefficients(run)
    cursor = session.connection().connection.driver_connection.cursor()  # type: ignore[union-attr]
    cursor.execute("SET LOCAL extra_float_digits = 1")  # shortest exact floats, whatever the server's default
    # Rows in the unique index's order, never sorted: with statistics older than the run's rows
    # (just filled, not yet analyzed) the planner would sort a whole run it takes for a few rows.
    cursor.execute("SET LOCAL enable_sort = off")
    piece_rows = min(CSV_CHUNK_ROWS, _COPY_PIECE_ROWS)
    pieces: list[bytes] = []
    with cursor.copy(f"COPY ({_copy_sql(run.id, c)}) TO STDOUT WITH (FORMAT csv)") as copy:
        for row in _copy_rows(copy):
            pieces.append(row)
            if len(pieces) == piece_rows:
                yield _piece(pieces, c)  # inside the block: a client that goes away cancels the COPY
                pieces.clear()
    if pieces:
        yield _piece(pieces, c)


def _copy_rows(copy: psycopg.Copy) -> Iterator[bytes]:
    """A COPY … TO STDOUT's rows (one per message), each copied out at once (cheaper than holding
    the message's buffer). psycopg's public read() only: taking rows from libpq directly saved
    little client CPU next to the COPY's own cost on the server, which bounds the export
    (docs/benchmarks/2026-11-30-2core.md, the CSV passes)."""
    while data := copy.read():
        yield bytes(data)


def _piece(lines: list[bytes], c: Coefficients) -> bytes:
    text = b"".join(lines)
    if _MARK[:1] in text:  # one memchr per piece; only then a look at each row's end
        redo = [at for at, line in enumerate(lines) if line.endswith(_MARK)]
        for at, line in zip(redo, _recompute([lines[i] for i in redo], c), strict=True):
            lines[at] = line
        text = b"".join(lines)
    return text


_MARK = b"\x01\n"  # the end of a row PostgreSQL left to _recompute


def _recompute(lines: list[bytes], c: Coefficients) -> list[bytes]:
    """Rows PostgreSQL left to us (a stored value outside its safe range), each made again from
    its own raw cells by the SQLite path's code: the same text SQLite writes for them."""
    rows = []
    for line in lines:
        *cells, rest = line.decode().split(",", len(_NUMERIC))
        channels = rest.rsplit(",", len(CSV_DERIVED_COLUMNS))[0]
        values = [
            (int(cell) if kind == "int" else float(cell)) if cell else None  # an empty cell: NULL
            for kind, cell in zip(_KINDS, cells, strict=True)
        ]
        rows.append((*values, channels))
    chunk = _Chunk(_arrow_columns(rows, (*_NUMERIC, "channel_cells")), {})
    return [line.encode() + b"\n" for line in _chunk_rows(chunk, c)]


# -- SQLite ---------------------------------------------------------------------------------------
_STORED = (*_NUMERIC, *_CHANNELS)  # the columns a SQLite chunk reads, in the CSV's order
_KEY = ("interval", "rank")  # the rows' order, and where the next chunk starts
_HELD = "(held)"  # the name of _sqlite_query's check cell: no column's
assert _STORED[: len(_KEY)] == _KEY, "the first column stays an array in the row join (_chunk_lines)"


def _sqlite_query(
    run_pk: int, columns: tuple[str, ...] = _STORED, held: tuple[str, ...] = (), after: bool = False
) -> str:
    """The run's rows in order: `columns` as stored, then, when some columns are `held`, a last
    cell that is 1 where each of them holds the value bound for it (its parameters, in order);
    `after`: only the rows after a key (interval, rank), bound after those."""
    select = list(columns)
    if held:
        select.append("(" + " AND ".join(f"{name} IS ?" for name in held) + ")")
    where = f"run_pk = {int(run_pk)}" + (" AND (interval, rank) > (?, ?)" if after else "")
    return f"SELECT {', '.join(select)} FROM intervals WHERE {where} ORDER BY interval, rank"


def _channel_cell(text: str | None) -> str:
    """A channel column's CSV cell as PostgreSQL's COPY writes it: NULL is empty, a text quoted
    (quotes doubled) when it holds a comma, a quote or a line break, is empty or is \\."""
    if text is None:
        return ""
    if '"' in text or "," in text or "\n" in text or "\r" in text or text in ("", "\\."):
        return '"' + text.replace('"', '""') + '"'
    return text


class _Chunk(NamedTuple):
    """A chunk's columns: those read, as Arrow arrays, and those that hold one value throughout
    (not read: the value of every row)."""

    read: dict[str, pa.Array]
    held: dict[str, Any]


def _csv_by_chunks(session: Session, run: Run) -> Iterator[memoryview]:
    c = coefficients(run)
    cursor = session.connection().connection.driver_connection.cursor()  # type: ignore[union-attr]
    try:
        for chunk in _sqlite_chunks(cursor, run.id):
            yield _chunk_text(chunk, c)
    finally:
        cursor.close()


def _sqlite_chunks(cursor: sqlite3.Cursor, run_pk: int) -> Iterator[_Chunk]:
    """The run's rows in chunks of CSV_CHUNK_ROWS, each read by a statement of its own (inside the
    session's transaction: one snapshot). sqlite3 hands out every cell as a Python object, its
    costliest step, so a column that held one value throughout the previous chunk is not read
    again but checked in SQL (`IS ?`, a fraction of a cell's cost). A chunk where a row breaks
    the check reads those columns after all."""
    held: dict[str, Any] = {}
    after: tuple[Any, ...] = ()
    while True:
        read = tuple(name for name in _STORED if name not in held)
        check = tuple(held)
        query = _sqlite_query(run_pk, read, check, bool(after)) + " LIMIT ?"
        rows = cursor.execute(query, (*held.values(), *after, CSV_CHUNK_ROWS)).fetchall()
        columns = _arrow_columns(rows, (*read, _HELD) if check else read)
        if not columns:
            return
        if check and not columns.pop(_HELD).to_numpy().all():  # a value changed: read them for every row
            query = _sqlite_query(run_pk, check, (), bool(after)) + " LIMIT ?"
            columns |= _arrow_columns(cursor.execute(query, (*after, CSV_CHUNK_ROWS)).fetchall(), check)
            held = {}
        chunk = _Chunk(columns, held)
        yield chunk
        held = held | {name: value for name, value in _one_values(columns).items() if name not in _KEY}
        after = tuple(columns[name][-1].as_py() for name in _KEY)


def _one_values(columns: dict[str, pa.Array]) -> dict[str, Any]:
    """The columns that hold one value (NULL or not) throughout, and that value."""
    out: dict[str, Any] = {}
    for name, column in columns.items():
        if column.null_count == len(column):
            out[name] = None
        elif column.null_count == 0:
            low, high = pc.min_max(column).values()
            if low == high:
                out[name] = low.as_py()
    return out


_TYPES = {
    **{name: pa.int64() if FIELD[name].kind == "int" else pa.float64() for name in _NUMERIC},
    **dict.fromkeys((*_CHANNELS, "channel_cells"), _STRING),  # channel_cells: both cells as one text
    _HELD: pa.int64(),
}


@functools.cache
def _row_type(names: tuple[str, ...]) -> pa.StructType:
    return pa.struct([(name, _TYPES[name]) for name in names])


def _arrow_columns(rows: list[tuple[Any, ...]], names: tuple[str, ...]) -> dict[str, pa.Array]:
    """Row tuples as Arrow columns by name (one conversion in compiled code); {} for no rows."""
    if not rows:
        return {}
    return dict(zip(names, pa.array(rows, _row_type(names)).flatten(), strict=True))


_KINDS = tuple(FIELD[name].kind for name in _NUMERIC)
_SUMMED = frozenset(SUM_FIELDS)  # the fields the sums read


def _chunk_text(chunk: _Chunk, c: Coefficients) -> memoryview:
    """The CSV rows of one chunk, as UTF-8: a view of the Arrow buffer that holds them."""
    lines = _chunk_lines(chunk, c, "\n")  # each line ends with a newline
    offsets = np.frombuffer(lines.buffers()[1], np.int32, len(lines) + 1, lines.offset * 4)
    return memoryview(lines.buffers()[2])[offsets[0] : offsets[-1]]  # the lines end to end


def _chunk_rows(chunk: _Chunk, c: Coefficients) -> list[str]:
    """_chunk_text's rows, each without its newline."""
    return [str(line) for line in _chunk_lines(chunk, c).to_pylist()]


def _chunk_lines(chunk: _Chunk, c: Coefficients, end: str = "") -> pa.StringArray:
    """The chunk's CSV lines, each ending with `end`, as one Arrow string array: each column
    becomes a string array of its cells (null: an empty cell) in compiled code, then Arrow joins
    them row-wise. `end` goes onto the last cells first (a short column, where appending it to the
    joined lines would copy them all again). A column that holds one value throughout the chunk
    (a run's GPU count, a model's absent window sums, a reading never sent) is written once and
    joined as a scalar, next to the scalars beside it; a float column equal bit for bit to the
    float column before it takes its cells (_FloatCells)."""
    read, held = chunk
    n = len(read[_KEY[0]])
    values: dict[str, np.ndarray] = {}  # the fields the sums read, as doubles (NULL: NaN)
    cells: list[pa.Array | pa.Scalar] = []
    float_cells = _FloatCells()
    for at, (name, kind) in enumerate(zip(_NUMERIC, _KINDS, strict=True)):
        if name in held:
            cell, value = _held_cell(held[name], kind)
            cells.append(cell)
            if name in _SUMMED:
                values[name] = np.full(n, value)
        elif kind == "int":
            column = read[name]
            ints = column.to_numpy() if column.null_count == 0 else None
            if at and ints is not None and (ints == ints[0]).all():  # the first column stays an array
                cells.append(pc.cast(column.slice(0, 1), _STRING)[0])
            else:
                cells.append(pc.cast(column, _STRING))  # digits, a '-' before negative ones
            if name in _SUMMED:  # an optional count's NULL becomes NaN, as a float's
                values[name] = column.to_numpy(zero_copy_only=False).astype(np.float64)
        else:
            floats = read[name].to_numpy(zero_copy_only=False)  # null (NULL) -> NaN
            cells.append(float_cells(floats))
            if name in _SUMMED:
                values[name] = floats
    if "channel_cells" in read:  # both channel cells already as CSV text (PostgreSQL's rows)
        cells.append(read["channel_cells"])
    for name in _CHANNELS if "channel_cells" not in read else ():
        cells.append(pa.scalar(_channel_cell(held[name]), _STRING) if name in held else channel_cells(read[name]))
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):  # inf and NaN are empty cells
        derived = derive_columns(sums_per_row(values), c, CSV_DERIVED_COLUMNS)
    cells += [float_cells(derived[name]) for name in CSV_DERIVED_COLUMNS]
    cells = _scalars_joined(cells)
    if end:
        cells[-1] = pc.binary_join_element_wise(cells[-1], end, "", null_handling="replace", null_replacement="")
    return pc.binary_join_element_wise(*cells, ",", null_handling="replace", null_replacement="")


def _held_cell(value: Any, kind: str) -> tuple[pa.Scalar, float]:
    """A held column's cell, as _chunk_lines writes the column's cells, and its value as a double."""
    if kind == "int" and value is None:  # an optional count never sent, NULL throughout: an empty cell
        return pa.scalar("", _STRING), math.nan
    if kind == "int":
        return pc.cast(pa.array([value], pa.int64()), _STRING)[0], float(value)
    floats = np.array([math.nan if value is None else value], np.float64)
    text = float_strings(floats)[0]
    return (text if text.is_valid else pa.scalar("", _STRING)), floats[0]


def _scalars_joined(cells: list[pa.Array | pa.Scalar]) -> list[pa.Array | pa.Scalar]:
    """Cells with each run of consecutive scalars joined into one (as the row join joins them):
    fewer arguments for the row join, which costs per argument and row."""
    out: list[pa.Array | pa.Scalar] = []
    for cell in cells:
        if out and isinstance(cell, pa.Scalar) and isinstance(out[-1], pa.Scalar):
            out[-1] = pa.scalar(f"{out[-1].as_py()},{cell.as_py()}", _STRING)
        else:
            out.append(cell)
    return out


class _FloatCells:
    """float_strings of a chunk's float columns, in order: a column of one value (bit for bit:
    one NaN, one zero's sign) is written once, as a string scalar ("" for NaN, an empty cell), and
    a column equal bit for bit to the one before it takes that one's cells. The checks cost a
    compare per value; a column's text, a shortest-digits conversion per value."""

    def __init__(self) -> None:
        self.bits: np.ndarray | None = None
        self.cells: pa.Array | pa.Scalar | None = None

    def __call__(self, floats: np.ndarray) -> pa.Array | pa.Scalar:
        bits = np.ascontiguousarray(floats, dtype=np.float64).view(np.int64)
        if self.bits is not None and np.array_equal(bits, self.bits):
            return self.cells
        if len(bits) and (bits == bits[0]).all():
            text = float_strings(floats[:1])[0]
            cells: pa.Array | pa.Scalar = text if text.is_valid else pa.scalar("", _STRING)
        else:
            cells = float_strings(floats)
        self.bits, self.cells = bits, cells
        return cells


def channel_cells(texts: pa.StringArray) -> pa.StringArray:
    """A channel column's stored texts as _channel_cell writes them (null: an empty cell), in
    compiled code: one regex pass picks the cells to quote, or where every cell holds a quote
    (the JSON of any object with a key) one substring search."""
    if pc.sum(pc.match_substring(texts, '"')).as_py() == len(texts) - texts.null_count > 0:
        return _quoted(texts)  # every cell is quoted; null stays null
    quote = pc.fill_null(pc.or_(pc.match_substring_regex(texts, '[",\\n\\r]'), pc.is_in(texts, _QUOTED_TEXTS)), False)
    if not pc.any(quote).as_py():
        return texts
    return pc.if_else(quote, _quoted(texts), texts)


def _quoted(texts: pa.StringArray) -> pa.StringArray:
    """Each text quoted, its quotes doubled."""
    return pc.binary_join_element_wise('"', pc.replace_substring(texts, '"', '""'), '"', "")


_QUOTED_TEXTS = pa.array(["", "\\."])  # quoted as COPY quotes them: an empty text is not NULL, \. ends its data
