"""Numbers as text, exactly as PostgreSQL's float8out writes them with extra_float_digits > 0, so
that the SQLite CSV export writes the text PostgreSQL's COPY writes (backend/reads/csv_export.py).

Integers are their digits. A float is its shortest digits that read back exactly, in fixed
notation for decimal exponents -4 to 14 with no trailing ".0" (``650``, ``0.25``, ``0.0001``) and as
``d.ddde±XX`` otherwise (``1e-05``, ``2.5e+15``); NaN is an empty cell.

* ``float_text``: one float, in Python; the reference the others are tested against cell by cell,
  and their fallback for rare values.
* ``float_cells``: a numpy column as a NUL-padded byte matrix, by a vectorized digit search.
* ``float_strings``: a numpy column as an Arrow string array, most of it by Arrow's own shortest
  digits in compiled code, the magnitudes where Arrow's layout or digits differ by the two above.
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pyarrow as pa  # type: ignore[import-untyped]  # no stubs, no py.typed
import pyarrow.compute as pc  # type: ignore[import-untyped]

_STRING = pa.string()


def float_strings(x: np.ndarray) -> pa.StringArray:
    """Each float as float_text writes it, as an Arrow string array; NaN is null (an empty cell).
    Arrow's cast writes a double's shortest digits (double-conversion) in fixed notation for
    decimal exponents -6..9 and as d.ddde±X otherwise: float8out's text for exponents -4..9, at
    least 15 and at most -10 (two-digit exponents). Whole numbers of exponents 10..14 are their
    int64 digits; integers from 2^54 to 2^62 (where float8out's digits may differ from the
    shortest ones) take _big_integer_strings; the rest of those magnitudes, float_cells."""
    a = np.abs(x)
    texts = pc.cast(pa.array(x, mask=np.isnan(x)), _STRING)
    if not ((a >= 1e10) | ((a < 1e-4) & (a >= 1e-9))).any():  # the usual column: Arrow's text throughout
        return texts
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


# -- one number at a time: the reference ----------------------------------------------------------
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
