"""The CSV export of a run: a header, then one row per stored interval with the catalogue's raw
fields and every derived metric, streamed in pieces so memory stays flat whatever the run's size.

Both databases write the same text. Numbers are written as PostgreSQL writes them (float8out with
extra_float_digits > 0): integers as digits; floats in their shortest form that reads back
exactly, in fixed notation for decimal exponents -4 to 14 with no trailing ".0" (``650``,
``0.25``, ``0.0001``) and as ``d.ddde±XX`` otherwise (``1e-05``, ``2.5e+15``); NULL (and an
undefined metric, and one that overflows a double) is an empty cell; one that underflows is 0 or
a subnormal, as IEEE doubles give it. channel_loss and channel_tokens are their stored JSON text,
quoted as CSV quotes it (when it holds a comma, a quote or a line break).

* PostgreSQL computes the derived columns (the catalogue's formulas as float8 SQL, each sum once
  per row) and formats every row itself (``COPY … TO STDOUT``): no Python work per value. Its
  float8 arithmetic raises where IEEE doubles overflow or underflow to 0, so it computes only
  rows whose stored floats lie in a range proven safe for the run (_float_range, in practice
  every real row); any other row comes back marked and is made again by the SQLite path's code.
* SQLite: columns are read in chunks through the raw sqlite3 cursor, the chunk's row tuples
  become Arrow columns (one conversion in compiled code), the derived columns are computed per
  chunk with numpy (backend/columns.py, the same IEEE operations in the same order as the SQL),
  and every column becomes a string array in compiled code: Arrow's shortest float digits where
  its layout is float8out's (float_strings), the vectorized digit search below elsewhere; Arrow
  then joins the cells row-wise. pyarrow is a server dependency for this (docs/BENCHMARKS.md).
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Iterator
from fractions import Fraction
from typing import Any

import numpy as np
import psycopg
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs, no py.typed
import pyarrow.compute as pc  # type: ignore[import-untyped]
from sqlalchemy.orm import Session

from packscope.backend.columns import derive_columns, sums_per_row
from packscope.backend.models import Run
from packscope.backend.queries import CSV_COLUMNS, CSV_DERIVED_COLUMNS, CSV_RAW_COLUMNS, coefficients
from packscope.core.catalogue import FIELD, FIELDS, SUM_FIELDS, SUMS, Coefficients, Sum, evaluate

CSV_CHUNK_ROWS = 10_000  # rows per piece of the response: bounded memory (a few MB), few round trips
_COPY_PIECE_ROWS = 2000  # PostgreSQL's pieces: nothing to amortize per piece, smaller buffers are cheaper
_CHANNELS = ("channel_loss", "channel_tokens")
_NUMERIC = tuple(name for name in CSV_RAW_COLUMNS if name not in _CHANNELS)
# The CSV's raw columns are the numeric fields, then the two channel columns, then the derived ones.
assert (*_NUMERIC, *_CHANNELS) == CSV_RAW_COLUMNS, "csv_export assumes the channel columns end the raw ones"


def csv_text(session: Session, run: Run) -> Iterator[str]:
    """The run's CSV (a header, then one row per stored interval), in pieces of about
    CSV_CHUNK_ROWS rows, read from the database as they are sent."""
    yield ",".join(CSV_COLUMNS) + "\n"  # plain names: nothing to quote
    if session.get_bind().dialect.name == "postgresql":
        yield from _csv_by_copy(session, run)
    else:
        yield from _csv_by_chunks(session, run)


# -- PostgreSQL -----------------------------------------------------------------------------------
class _Sql:
    """A float8 SQL expression: the catalogue's formulas evaluated on these build the SQL text
    with the same operations, in the same order, as numpy evaluates them (no NUMERIC casts)."""

    def __init__(self, text: str) -> None:
        self.text = text

    @staticmethod
    def of(value: Any) -> _Sql:
        return value if isinstance(value, _Sql) else _Sql(f"'{float(value)!r}'::float8")

    def _op(self, op: str, other: Any, reflected: bool = False) -> _Sql:
        a, b = (_Sql.of(other), self) if reflected else (self, _Sql.of(other))
        return _Sql(f"({a.text} {op} {b.text})")

    def __add__(self, o: Any) -> _Sql:
        return self._op("+", o)

    def __radd__(self, o: Any) -> _Sql:
        return self._op("+", o, True)

    def __sub__(self, o: Any) -> _Sql:
        return self._op("-", o)

    def __rsub__(self, o: Any) -> _Sql:
        return self._op("-", o, True)

    def __mul__(self, o: Any) -> _Sql:
        return self._op("*", o)

    def __rmul__(self, o: Any) -> _Sql:
        return self._op("*", o, True)

    def __truediv__(self, o: Any) -> _Sql:
        return self._op("/", o)

    def __rtruediv__(self, o: Any) -> _Sql:
        return self._op("/", o, True)


class _SqlOps:
    """A division by 0 is NULL, and NULL stays NULL (an empty cell), as NaN does in numpy."""

    @staticmethod
    def ratio(num: Any, den: Any) -> _Sql:
        return _Sql(f"({_Sql.of(num).text} / NULLIF({_Sql.of(den).text}, 0))")


# Every intermediate value of the derived columns must stay inside these magnitudes for
# PostgreSQL to compute a row: float8 arithmetic there raises on overflow and on underflow to 0
# (numpy and the SQLite path return inf or 0 and go on). Rows whose stored values could leave
# them are computed by the SQLite path's numpy code instead (_recompute), so both write the same.
_SAFE_LOW, _SAFE_HIGH = 1e-300, 1e300
# The stored floats a row may hold (besides 0 and NULL) for PostgreSQL to compute it: the widest
# of these that _Bound's analysis proves safe for the run's coefficients.
_FLOAT_RANGES = ((1e-100, 1e100), (1e-30, 1e30), (1e-8, 1e8))


class _Bound:
    """Bounds on |x| over the nonzero values x an expression can take (0 never overflows nor
    underflows); `bad` once any intermediate value may leave [_SAFE_LOW, _SAFE_HIGH]."""

    def __init__(self, low: float, high: float, bad: bool = False) -> None:
        self.low, self.high = low, high
        self.bad = bad or (high > 0 and not (low >= _SAFE_LOW and high <= _SAFE_HIGH))

    @staticmethod
    def of(value: Any) -> _Bound:
        if isinstance(value, _Bound):
            return value
        a = abs(float(value))
        return _Bound(a, a) if a else _NO_VALUE

    def _mul(self, o: _Bound) -> _Bound:
        if self.high == 0 or o.high == 0:
            return _Bound(math.inf, 0.0, self.bad or o.bad)
        return _Bound(self.low * o.low, self.high * o.high, self.bad or o.bad)

    def _div(self, o: _Bound) -> _Bound:
        if o.high == 0 or self.high == 0:  # x / NULL is NULL, 0 / x is 0: nothing to check
            return _Bound(math.inf, 0.0, self.bad or o.bad)
        if o.low == 0:
            return _Bound(0.0, math.inf, True)
        return _Bound(self.low / o.high, self.high / o.low, self.bad or o.bad)

    def _add(self, o: _Bound) -> _Bound:
        # A nonzero sum or difference of two doubles is at least the smaller one's spacing.
        return _Bound(min(self.low, o.low) * 2.0**-53, self.high + o.high, self.bad or o.bad)

    def __add__(self, o: Any) -> _Bound:
        return self._add(_Bound.of(o))

    __radd__ = __sub__ = __rsub__ = __add__

    def __mul__(self, o: Any) -> _Bound:
        return self._mul(_Bound.of(o))

    __rmul__ = __mul__

    def __truediv__(self, o: Any) -> _Bound:
        return self._div(_Bound.of(o))

    def __rtruediv__(self, o: Any) -> _Bound:
        return _Bound.of(o)._div(self)


_NO_VALUE = _Bound(math.inf, 0.0)  # an expression that is always 0 or NULL


class _BoundOps:
    @staticmethod
    def ratio(num: Any, den: Any) -> _Bound:
        return _Bound.of(num) / _Bound.of(den)


class _Uses(dict[str, Any]):
    """The sums a formula reads, recorded as it reads them."""

    def __init__(self) -> None:
        super().__init__()
        self.read: set[str] = set()

    def __missing__(self, key: str) -> _Bound:
        self.read.add(key)
        return _Bound(1.0, 1.0)


_FLOAT_FIELDS = frozenset(f.name for f in FIELDS if f.kind == "float")


def _float_range(c: Coefficients, sums: list[Sum]) -> tuple[float, float] | None:
    """The widest of _FLOAT_RANGES over which PostgreSQL computes every derived column of a row
    without leaving [_SAFE_LOW, _SAFE_HIGH], or None when even the narrowest is not safe."""
    for low, high in _FLOAT_RANGES:
        bounds = {}
        for s in sums:
            value = _Bound(1.0, 1.0)
            for name in s.of:
                f = FIELD[name]
                value = value * (_Bound(low, min(high, f.upper)) if f.kind == "float" else _Bound(1.0, f.upper))
            bounds[s.name] = value
        if not any(_Bound.of(v).bad for v in evaluate(bounds, c, _BoundOps(), CSV_DERIVED_COLUMNS).values()):
            return low, high
    return None


def _copy_sql(run_pk: int, c: Coefficients) -> str:
    """COPY's query: the raw cells, then the derived columns as float8 SQL. A stored float
    outside the range proven safe reads as NaN in the formulas (nothing can raise), and such a
    row's last cell is the control character U+0001 (the last column is otherwise a float8
    written as text, or NULL, and the channels' JSON escapes control characters): one memchr per
    piece tells _csv_by_copy whether a row of it must be made again."""
    uses = _Uses()
    evaluate(uses, c, _BoundOps(), CSV_DERIVED_COLUMNS)
    sums = [s for s in SUMS if s.name in uses.read]
    safe = _float_range(c, sums)
    order = f"FROM intervals WHERE run_pk = {int(run_pk)} ORDER BY interval, rank"
    raw = [f"{name}::text" if name in _CHANNELS else name for name in CSV_RAW_COLUMNS]
    if safe is None:  # no row is computed here
        derived = ["NULL::float8"] * (len(CSV_DERIVED_COLUMNS) - 1) + ["chr(1)"]
        return f"SELECT {', '.join(raw + derived)} {order}"
    in_range = f"BETWEEN {safe[0]!r} AND {safe[1]!r}"
    floats = sorted({name for s in sums for name in s.of if name in _FLOAT_FIELDS}, key=CSV_RAW_COLUMNS.index)
    refs = {}
    for s in sums:
        value = None
        for name in s.of:
            if name in _FLOAT_FIELDS:
                field = _Sql(
                    f"(CASE WHEN abs({name}) {in_range} OR {name} = 0 THEN {name}::float8 ELSE 'NaN'::float8 END)"
                )
            else:
                field = _Sql(f"{name}::float8")
            value = field if value is None else value * field
        assert value is not None
        text = value.text
        if s.present is not None:
            text = f"(CASE WHEN {s.present} IS NULL THEN 0::float8 ELSE {text} END)"
        refs[s.name] = _Sql(text)
    derived = [_Sql.of(v).text for v in evaluate(refs, c, _SqlOps(), CSV_DERIVED_COLUMNS).values()]
    if floats:
        ok = " AND ".join(f"(abs({name}) {in_range} OR {name} = 0 OR {name} IS NULL)" for name in floats)
        derived[-1] = f"CASE WHEN {ok} THEN ({derived[-1]})::text ELSE chr(1) END"
    return f"SELECT {', '.join(raw + derived)} {order}"


def _csv_by_copy(session: Session, run: Run) -> Iterator[str]:
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
    0.3 µs a row of client CPU, not worth leaning on psycopg's internals (the COPY's own 3.5 µs a
    row on the server is what bounds the export)."""
    while data := copy.read():
        yield bytes(data)


def _piece(lines: list[bytes], c: Coefficients) -> str:
    text = b"".join(lines)
    if _MARK[:1] in text:  # one memchr per piece; only then a look at each row's end
        redo = [at for at, line in enumerate(lines) if line.endswith(_MARK)]
        for at, line in zip(redo, _recompute([lines[i] for i in redo], c), strict=True):
            lines[at] = line
        text = b"".join(lines)
    return text.decode()


_MARK = b"\x01\n"  # the end of a row PostgreSQL left to _recompute


def _recompute(lines: list[bytes], c: Coefficients) -> list[bytes]:
    """Rows PostgreSQL left to us (a stored value outside its safe range), each made again from
    its own raw cells by the SQLite path's code: the same text SQLite writes for them."""
    rows = []
    for line in lines:
        *cells, rest = line.decode().split(",", len(_NUMERIC))
        channels = rest.rsplit(",", len(CSV_DERIVED_COLUMNS))[0]
        values = [
            int(cell) if kind == "int" else (float(cell) if cell else None)
            for kind, cell in zip(_KINDS, cells, strict=True)
        ]
        rows.append((*values, channels))
    return [line.encode() + b"\n" for line in _chunk_rows(rows, c)]


# -- SQLite ---------------------------------------------------------------------------------------
def _sqlite_query(run_pk: int) -> str:
    """The numeric fields as stored, then the two channel columns' JSON text (or NULL)."""
    return (
        f"SELECT {', '.join((*_NUMERIC, *_CHANNELS))} FROM intervals WHERE run_pk = {int(run_pk)}"
        " ORDER BY interval, rank"
    )


def _channel_cell(text: str | None) -> str:
    """A channel column's CSV cell as PostgreSQL's COPY writes it: NULL is empty, a text quoted
    (quotes doubled) when it holds a comma, a quote or a line break, is empty or is \\."""
    if text is None:
        return ""
    if '"' in text or "," in text or "\n" in text or "\r" in text or text in ("", "\\."):
        return '"' + text.replace('"', '""') + '"'
    return text


def _csv_by_chunks(session: Session, run: Run) -> Iterator[str]:
    c = coefficients(run)
    connection = session.connection().connection.driver_connection
    cursor = connection.cursor()  # type: ignore[union-attr]
    try:
        cursor.execute(_sqlite_query(run.id))
        while rows := cursor.fetchmany(CSV_CHUNK_ROWS):
            yield _chunk_text(rows, c)
    finally:
        cursor.close()


_KINDS = tuple(FIELD[name].kind for name in _NUMERIC)
_SUM_AT = {name: _NUMERIC.index(name) for name in SUM_FIELDS}


def _chunk_text(rows: list[tuple[Any, ...]], c: Coefficients) -> str:
    """CSV rows for one chunk of (numeric fields..., channel_loss, channel_tokens) tuples, or of
    (numeric fields..., "channel_loss cell,channel_tokens cell") tuples."""
    lines = pc.binary_join_element_wise(_chunk_lines(rows, c), "", "\n")  # each line ends with a newline
    offsets = np.frombuffer(lines.buffers()[1], np.int32, len(lines) + 1, lines.offset * 4)
    return codecs.utf_8_decode(memoryview(lines.buffers()[2])[offsets[0] : offsets[-1]])[0]  # the lines end to end


def _chunk_rows(rows: list[tuple[Any, ...]], c: Coefficients) -> list[str]:
    """_chunk_text's rows, each without its newline."""
    return [str(line) for line in _chunk_lines(rows, c).to_pylist()]


def _chunk_lines(rows: list[tuple[Any, ...]], c: Coefficients) -> pa.StringArray:
    """The chunk's CSV lines (no newline) as one Arrow string array: each column becomes a string
    array of its cells (null: an empty cell) in compiled code, then Arrow joins them row-wise."""
    fetched = pa.array(rows, _ROW_TYPES[len(rows[0])]).flatten()  # the tuples as columns, in compiled code
    values: dict[str, np.ndarray] = {}
    cells: list[pa.Array] = []
    for name, kind, column in zip(_NUMERIC, _KINDS, fetched, strict=False):
        if kind == "int":
            cells.append(pc.cast(column, _STRING))  # digits, a '-' before negative ones
            if name in _SUM_AT:
                values[name] = column.to_numpy().astype(np.float64)
        else:
            floats = column.to_numpy(zero_copy_only=False)  # null (NULL) -> NaN
            cells.append(float_strings(floats))
            if name in _SUM_AT:
                values[name] = floats
    n = len(_NUMERIC)
    if len(fetched) == n + 1:  # the channel cells already as CSV text (PostgreSQL's rows)
        cells.append(fetched[n])
    else:  # the two columns' stored text
        cells += [channel_cells(fetched[n]), channel_cells(fetched[n + 1])]
    with np.errstate(over="ignore", under="ignore", invalid="ignore"):  # inf and NaN are empty cells
        derived = derive_columns(sums_per_row(values), c, CSV_DERIVED_COLUMNS)
    cells += [float_strings(derived[name]) for name in CSV_DERIVED_COLUMNS]
    return pc.binary_join_element_wise(*cells, ",", null_handling="replace", null_replacement="")


_STRING = pa.string()
_NUMERIC_TYPES = [
    (name, pa.int64() if kind == "int" else pa.float64()) for name, kind in zip(_NUMERIC, _KINDS, strict=True)
]
# A chunk's row tuples as one struct array: the stored text of both channel columns, or
# (PostgreSQL's rows made again) their CSV cells as one text.
_ROW_TYPES = {
    len(_NUMERIC) + 2: pa.struct([*_NUMERIC_TYPES, *((name, _STRING) for name in _CHANNELS)]),
    len(_NUMERIC) + 1: pa.struct([*_NUMERIC_TYPES, ("channel_cells", _STRING)]),
}


def channel_cells(texts: pa.StringArray) -> pa.StringArray:
    """A channel column's stored texts as _channel_cell writes them (null: an empty cell), in
    compiled code: one regex pass picks the cells to quote."""
    quote = pc.fill_null(pc.or_(pc.match_substring_regex(texts, '[",\\n\\r]'), pc.is_in(texts, _QUOTED_TEXTS)), False)
    if not pc.any(quote).as_py():
        return texts
    return pc.if_else(quote, pc.binary_join_element_wise('"', pc.replace_substring(texts, '"', '""'), '"', ""), texts)


_QUOTED_TEXTS = pa.array(["", "\\."])  # quoted as COPY quotes them: an empty text is not NULL, \. ends its data


def float_strings(x: np.ndarray) -> pa.StringArray:
    """Each float as float_text writes it, as an Arrow string array; NaN is null (an empty cell).
    Arrow's cast writes a double's shortest digits (double-conversion) in fixed notation for
    decimal exponents -6..9 and as d.ddde±X otherwise: float8out's text for exponents -4..9, at
    least 15 and at most -10 (two-digit exponents). Whole numbers of exponents 10..14 are their
    int64 digits; integers from 2^54 to 2^62 (where float8out's digits may differ from the
    shortest ones) take _big_integer_strings; the rest of those magnitudes, float_cells."""
    a = np.abs(x)
    texts = pc.cast(pa.array(x, mask=np.isnan(x)), _STRING)
    whole = (a >= 1e10) & (a < 1e15)  # below 2^53: a whole number's shortest digits are its own
    with np.errstate(invalid="ignore"):
        other = whole & (x != np.trunc(x))
    whole &= ~other
    big = (a >= 2.0**54) & (a < 2.0**62)
    other |= ((a >= 1e-9) & (a < 1e-4)) | (a >= 2.0**62)  # False for NaN, True for inf
    for mask, replace in (
        (whole, lambda v: pc.cast(pa.array(v.astype(np.int64)), _STRING)),
        (big, _big_integer_strings),
        (other, lambda v: _matrix_strings(float_cells(v))),
    ):
        if mask.any():
            texts = pc.replace_with_mask(texts, pa.array(mask), replace(x[mask]))
    return texts


def _big_integer_strings(x: np.ndarray) -> pa.StringArray:
    """float_text of doubles 2^54 <= |x| < 2^62 (integers, exact in int64), in int64 arithmetic:
    the shortest decimal that reads back as x, closest to x (Python's repr: a decimal exactly
    halfway to a neighbour counts when x's significand is even), unless it lies exactly halfway,
    where float8out writes the correctly rounded decimal with the fewest digits strictly inside."""
    a = np.abs(x)
    xi = a.astype(np.int64)
    _, e = np.frexp(a)
    shift = (e - 53).astype(np.int64)  # the gap to the next double is 2^shift (>= 4)
    h = np.left_shift(np.int64(1), shift - 1)  # half the gap above
    hb = np.where(a == np.ldexp(0.5, e), h >> 1, h)  # and below: half as much at a power of two
    even = ((xi >> shift) & 1) == 0
    # Per value: repr's choice at the longest 10^j that still has a candidate, whether it lies on a
    # bound, and the nearest multiple strictly inside at the longest 10^j below it (float8out's).
    chosen, chosen_j = xi.copy(), np.zeros(len(x), np.int64)
    on_bound = np.zeros(len(x), bool)
    inside, inside_j = xi.copy(), np.zeros(len(x), np.int64)  # 10^0: x itself
    fallback, fallback_j = xi.copy(), np.zeros(len(x), np.int64)
    at = np.arange(len(x))  # values that may still have a candidate (a multiple of 10^(j+1) is one of 10^j)
    for j in range(1, 19):
        u = _POW10[j]
        v, up, down = xi[at], h[at], hb[at]
        below = v % u  # distance to the multiple at or below
        above = u - below
        ok_below = (below < down) | (even[at] & (below == down))
        ok_above = (above < up) | (even[at] & (above == up))
        keep = ok_below | ok_above
        at, v, below, above, ok_below, ok_above, up, down = (
            t[keep] for t in (at, v, below, above, ok_below, ok_above, up, down)
        )
        if not len(at):
            break
        take_below = ok_below & (~ok_above | (below < above))
        chosen[at] = np.where(take_below, v - below, v + above)
        chosen_j[at] = j
        on_bound[at] = np.where(take_below, below == down, above == up)
        fallback[at], fallback_j[at] = inside[at], inside_j[at]
        nearer_below = below < above  # equal only where both are too far (u/2 >= 500 > half a gap)
        strict = np.where(nearer_below, below < down, above < up)
        inside[at[strict]] = np.where(nearer_below, v - below, v + above)[strict]
        inside_j[at[strict]] = j
    q = np.where(on_bound, fallback, chosen)
    digits = q // _POW10[np.where(on_bound, fallback_j, chosen_j)]  # no trailing zero: a longer 10^j had taken it
    exponent = np.searchsorted(_POW10, q, side="right") - 1  # 16..18
    text = pc.cast(pa.array(digits), _STRING)
    return pc.binary_join_element_wise(
        pc.if_else(pa.array(np.signbit(x)), "-", ""),
        pc.utf8_slice_codeunits(text, 0, 1),
        pc.if_else(pa.array(digits >= 10), ".", ""),
        pc.utf8_slice_codeunits(text, 1, 20),
        "e+",
        pc.cast(pa.array(exponent), _STRING),
        "",
    )


def _matrix_strings(cells: np.ndarray) -> pa.StringArray:
    """A NUL-padded byte matrix (one row per value) as an Arrow string array."""
    offsets = np.zeros(len(cells) + 1, np.int32)
    np.cumsum(np.count_nonzero(cells, axis=1), out=offsets[1:])
    data = cells.tobytes().translate(None, b"\0")
    return pa.StringArray.from_buffers(len(cells), pa.py_buffer(offsets), pa.py_buffer(data))


# -- numbers as text ------------------------------------------------------------------------------
def float_text(x: float) -> str:
    """One float as PostgreSQL's float8out writes it with extra_float_digits > 0 (shortest exact
    digits; fixed notation for decimal exponents -4..14, else d.ddde±XX); NaN is an empty cell.
    The reference the vectorized float_cells follows, and its fallback for rare values."""
    if math.isnan(x):
        return ""
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    sign = "-" if math.copysign(1.0, x) < 0 else ""
    if x == 0:
        return sign + "0"
    a = abs(x)
    text = repr(a)  # Python's shortest digits: PostgreSQL's too, but for one case below
    if a >= 2.0**54:  # only here can a short decimal fall exactly halfway between two doubles
        exact, shortest = Fraction(a), Fraction(text)
        above = math.nextafter(a, math.inf)
        bounds = (
            (exact + Fraction(math.nextafter(a, 0.0))) / 2,
            (exact + (Fraction(above) if above < math.inf else Fraction(2) ** 1024)) / 2,
        )
        if shortest in bounds:  # Python accepts such a halfway decimal (it reads back as `a`); PostgreSQL does
            for count in range(2, 18):  # not, and writes the nearest decimal strictly inside instead
                text = f"{a:.{count - 1}e}"
                if bounds[0] < Fraction(text) < bounds[1]:
                    break
    mantissa, _, exp = text.partition("e")
    whole, _, frac = mantissa.partition(".")
    if whole != "0":
        digits, exponent = whole + frac, len(whole) - 1 + int(exp or 0)
    else:
        stripped = frac.lstrip("0")
        digits, exponent = stripped, len(stripped) - len(frac) - 1 + int(exp or 0)
    return sign + _layout(digits.rstrip("0"), exponent)


def _layout(digits: str, exponent: int) -> str:
    n = len(digits)
    if -4 <= exponent < 15:
        if exponent < 0:
            return "0." + "0" * (-exponent - 1) + digits
        if n <= exponent + 1:
            return digits + "0" * (exponent + 1 - n)
        return digits[: exponent + 1] + "." + digits[exponent + 1 :]
    tail = "." + digits[1:] if n > 1 else ""
    return f"{digits[0]}{tail}e{'-' if exponent < 0 else '+'}{abs(exponent):02d}"


# Powers of ten as double-doubles (hi + lo, hi the nearest double): x·10^p to ~2^-104.
_P_MIN, _P_MAX = -300, 300
_P10_HI = np.array([float(Fraction(10) ** p) for p in range(_P_MIN, _P_MAX + 1)])
_P10_LO = np.array(
    [float(Fraction(10) ** p - Fraction(h)) for p, h in zip(range(_P_MIN, _P_MAX + 1), _P10_HI.tolist(), strict=True)]
)
_POW10 = np.array([10**i for i in range(19)], dtype=np.int64)
_ZERO, _DOT, _MINUS = ord("0"), ord("."), ord("-")
# Inside this range the digit search below is exact (no overflow in splits or products).
_FAST_MIN, _FAST_MAX = 1e-280, 1e280
_MARGIN = 1e-6  # in units of the last digit: decisions this close to a bound go to float_text


def _two_product(a: np.ndarray, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """a·b exactly as hi + lo (Dekker, with Veltkamp splits: no FMA needed)."""
    p = a * b
    t = 134217729.0 * a
    ah = t - (t - a)
    al = a - ah
    t = 134217729.0 * b
    bh = t - (t - b)
    bl = b - bh
    return p, ((ah * bh - p) + ah * bl + al * bh) + al * bl


def _shortest(a: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """For positive finite a inside the fast range: (digits as int64 without trailing zeros,
    their count, the decimal exponent of the first digit, where the answer is not certain)."""
    k = np.floor(np.log10(a)).astype(np.int64)
    k -= a < _P10_HI[k - _P_MIN]
    k += a >= _P10_HI[k + 1 - _P_MIN]
    p = 16 - k  # a·10^p has 17 digits before the point
    hi, lo = _P10_HI[p - _P_MIN], _P10_LO[p - _P_MIN]
    yh, yl = _two_product(a, hi)
    yl = yl + a * lo
    s = yh + yl  # an integer-valued double: y >= 1e16 > 2^53
    yl = yl - (s - yh)
    t = np.rint(yl)
    digits17 = s.astype(np.int64) + t.astype(np.int64)
    r17 = yl - t  # a·10^p - digits17, in [-0.5, 0.5]
    above = np.spacing(a) * 0.5 * hi  # half the gap to the next double, scaled
    power_of_two = np.frexp(a)[0] == 0.5
    below = np.where(power_of_two, above * 0.5, above)  # the gap below a power of two is half the one above
    uncertain = (digits17 < _POW10[16]) | (digits17 >= _POW10[17])

    def level(r: np.ndarray, up: np.ndarray, down: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        ok = (r > -up + _MARGIN) & (r < down - _MARGIN)
        close = (np.abs(r + up) <= _MARGIN) | (np.abs(r - down) <= _MARGIN) | (np.abs(np.abs(r) - 0.5) <= _MARGIN)
        return ok, close

    def coarser(d: np.ndarray, r: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        q, last = np.divmod(d, 10)
        f = (last + r) / 10.0
        rounds_up = f > 0.5
        return q + rounds_up, f - rounds_up

    ok17, close17 = level(r17, above, below)
    digits16, r16 = coarser(digits17, r17)
    ok16, close16 = level(r16, above / 10, below / 10)
    digits15, r15 = coarser(digits16, r16)
    ok15, close15 = level(r15, above / 100, below / 100)
    uncertain |= close15 | (~ok15 & (close16 | (~ok16 & (close17 | ~ok17))))
    # Around a power of two the interval is lopsided: the nearest candidate may miss it while the
    # next one hits; Python's repr settles those (few) values.
    uncertain |= power_of_two & ~ok15
    count = np.where(ok15, 15, np.where(ok16, 16, 17))
    digits = np.where(ok15, digits15, np.where(ok16, digits16, digits17))
    exponent = k.copy()
    carried = digits == _POW10[count]  # 9.99… rounded up to 10…0: one digit fewer, one exponent more
    digits = np.where(carried, digits // 10, digits)
    count = count - carried
    exponent += carried
    for step in (16, 8, 4, 2, 1):
        divisible = digits % _POW10[step] == 0
        digits = np.where(divisible, digits // _POW10[step], digits)
        count = count - divisible * step
    return digits, count, exponent, uncertain


def float_cells(x: np.ndarray) -> np.ndarray:
    """Each float as float_text writes it, as a NUL-padded byte matrix (one row per value)."""
    n = len(x)
    a = np.abs(x)
    fast = (a >= _FAST_MIN) & (a <= _FAST_MAX)  # False for NaN, inf and 0
    if fast.all():  # the usual chunk: no NULL, no zero
        digits, count, exponent, uncertain = _shortest(a)
        fast = ~uncertain
    else:
        digits = np.ones(n, np.int64)
        count = np.ones(n, np.int64)
        exponent = np.zeros(n, np.int64)
        if fast.any():
            d, cnt, e, uncertain = _shortest(a[fast])
            digits[fast], count[fast], exponent[fast] = d, cnt, e
            fast[np.flatnonzero(fast)[uncertain]] = False
    zero = a == 0
    digits[zero] = 0
    nan = np.isnan(x)  # NULL or undefined: an empty cell
    if nan.all():
        return np.zeros((n, 1), np.uint8)
    other = ~fast & ~zero & ~nan  # inf, out of the fast range, uncertain: written by float_text
    fixed = (exponent >= -4) & (exponent < 15)
    # Body: the digits, with a point after `lead` of them when more follow ("0." of small
    # numbers and the exponent of scientific ones are slots of their own, before and after).
    lead = np.where(fixed, np.where(exponent >= 0, exponent + 1, count), 1)
    body_length = np.where(count > lead, count + 1, lead)
    width = max(int(body_length.max(initial=1)), 1)
    left = digits * _POW10[17 - count]  # 17 digits, first one leading, zeros after the last
    digit_chars = _digit_rows(left, width + 1).T  # row j: the j-th digit of every value
    point = np.where(count > lead, lead, width)  # where the point goes; `width`: nowhere
    first, last = int(point.min(initial=0)), int(point.max(initial=0))
    if first == last:  # one layout for the whole chunk (most columns): slices, no per-value choice
        body = np.empty((n, width), np.uint8)
        body[:, :first] = digit_chars[:, :first]
        if first < width:
            body[:, first] = _DOT
            body[:, first + 1 :] = digit_chars[:, first : width - 1]
    else:
        position = np.arange(width, dtype=np.uint8)[None, :]  # small numbers: uint8 compares are the fastest
        point_col = point.astype(np.uint8)[:, None]
        shifted = np.concatenate([digit_chars[:, :1], digit_chars[:, : width - 1]], axis=1)
        point_or_after = np.where(position == point_col, np.uint8(_DOT), shifted)
        body = np.where(position < point_col, digit_chars[:, :width], point_or_after)
    if int(body_length.min(initial=width)) < width:
        body *= np.arange(width, dtype=np.uint8)[None, :] < body_length.astype(np.uint8)[:, None]  # NUL after the end
    slots = [body]
    small = fixed & (exponent < 0) & ~other
    if small.any():  # "0." and up to three zeros before the digits
        prefix_length = np.where(small, 1 - exponent, 0).astype(np.uint8)[:, None]
        prefix = np.frombuffer(b"0.000", np.uint8)[None, :] * (np.arange(5, dtype=np.uint8)[None, :] < prefix_length)
        slots.insert(0, prefix)
    scientific = ~fixed & ~other & ~zero
    if scientific.any():
        exp = np.zeros((n, 5), np.uint8)
        e = np.abs(exponent)
        exp[scientific, 0] = ord("e")
        exp[scientific, 1] = np.where(exponent[scientific] < 0, _MINUS, ord("+"))
        three = scientific & (e >= 100)
        exp[three, 2] = e[three] // 100 + _ZERO
        exp[scientific, 3] = (e[scientific] // 10) % 10 + _ZERO
        exp[scientific, 4] = e[scientific] % 10 + _ZERO
        slots.append(exp)
    negative = np.signbit(x) & ~other
    if negative.any():
        slots.insert(0, (negative * np.uint8(_MINUS)).astype(np.uint8)[:, None])
    cells = np.concatenate(slots, axis=1) if len(slots) > 1 else body
    if nan.any():
        cells[nan] = 0
    if other.any():
        texts = [float_text(v).encode() for v in x[other].tolist()]
        longest = max(map(len, texts))
        if longest > cells.shape[1]:
            cells = np.concatenate([cells, np.zeros((n, longest - cells.shape[1]), np.uint8)], axis=1)
        cells[other] = 0
        for row, text in zip(np.flatnonzero(other).tolist(), texts, strict=True):
            cells[row, : len(text)] = np.frombuffer(text, np.uint8)
    return cells


_POW10_FLOAT = 10.0 ** np.arange(10)
_BILLION = 1_000_000_000


def _digit_rows(left: np.ndarray, rows: int) -> np.ndarray:
    """The first `rows` (at most 17 used, the rest '0') decimal digits of 17-digit integers, as
    ASCII, one row per digit. In doubles, 8 and 9 digits at a time: floor(part / 10^k) of an
    integer part < 2^30 is exact, and double division is much faster than numpy's int64 one."""
    out = np.full((rows, len(left)), _ZERO, np.uint8)
    high = left // _BILLION
    for part, first, count in ((high, 0, 8), (left - high * _BILLION, 8, 9)):
        if first >= rows:
            break
        whole = part.astype(np.float64)
        above: np.ndarray | None = None  # floor(whole / 10^(k+1))
        for j in range(first, min(rows, first + count)):
            k = first + count - 1 - j
            q = np.floor(whole / _POW10_FLOAT[k]) if k else whole
            np.add(q if above is None else q - 10.0 * above, _ZERO, out=out[j], casting="unsafe")
            above = q
    return out
