"""The interval record of the wire contract (docs/wire.md): one type, generated from the catalogue.

* The msgspec structs are the decoder of a batch (every catalogue field's type and bounds, the
  non-scalar parts' shapes and limits) and, through msgspec's JSON schema, the OpenAPI body.
* `check` is what spans fields or records, written once: steps within the span, real tokens
  within the slots, the wall clock in order, each sync site once, optional readings within their
  bounds (one that diverged, beyond ±FLOAT_MAX, is stored as missing), no float too small for
  every database's arithmetic, strings every database can store.
* Every problem is a `RecordError`, located (("intervals", i, field, ...)) for the 422 answer.

Fields the record does not know are ignored, so a newer agent can still talk to this server, and
named in the answer (`ignored`), so a misspelt field is not dropped without a word.
"""

import json
import operator
import re
from collections.abc import Callable, Sequence
from typing import Annotated, Any, NamedTuple

import msgspec

from packscope.backend.api.text import text_problem
from packscope.core.catalogue import (
    FIELDS,
    FLOAT_MAX,
    FLOAT_MIN,
    INT64_MAX,
    MAX_BATCH,
    MAX_CHANNEL_NAME,
    MAX_SITE_LENGTH,
    MAX_SYNC_SITES,
)
from packscope.core.catalogue import Field as CatalogueField
from packscope.core.histograms import NUM_BUCKETS

Location = tuple[str | int, ...]


class RecordError(ValueError):
    """A batch that cannot be stored: every problem found, each (location, message, kind)."""

    def __init__(self, problems: Sequence[tuple[Location, str, str]]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, loc))}: {message}" for loc, message, _ in problems))
        self.problems = list(problems)


# -- the structs ------------------------------------------------------------------------------------
def _scalar(f: CatalogueField, bounded: bool) -> Any:
    """A catalogue field's type, within its bounds. An optional float is bounded only in the
    `bounded` family: elsewhere `check` bounds it, which stores a reading that diverged as missing
    rather than refusing the batch."""
    lower = f.minimum if f.minimum is not None else -f.upper
    if f.kind == "int":
        return Annotated[int, msgspec.Meta(ge=lower, le=f.upper, description=f.doc)]
    if not f.required and not bounded:
        return Annotated[float, msgspec.Meta(description=f.doc)] | None
    number = Annotated[float, msgspec.Meta(ge=lower, le=f.upper, description=f.doc)]
    return number if f.required else number | None


def _fields_under(parent: tuple[str, ...], bounded: bool) -> list[tuple[Any, ...]]:
    """The struct fields of the catalogue fields that live in the object at `parent`."""
    return [
        (f.wire_path[-1], _scalar(f, bounded))
        if f.required and f.default is None
        else (f.wire_path[-1], _scalar(f, bounded), f.default)
        for f in FIELDS
        if f.wire_path[:-1] == parent
    ]


def _types(forbid_unknown: bool, bounded: bool = False) -> dict[str, Any]:
    """The record's structs. Three families of the one definition: the strict one refuses a field
    it does not know (at C speed, no walk of the keys); the lenient one takes a batch that holds
    such fields (they are then named in the answer, `ignored`); the bounded one is the strict one
    with the optional readings (channel losses included) held within their bounds too, so that a
    batch it decodes has no reading for `check` to judge (see `decode`)."""

    def struct(name: str, fields: list[tuple[Any, ...]]) -> Any:
        # gc=False: a decoded record holds no reference cycles, so the collector need not track it.
        return msgspec.defstruct(name, fields, kw_only=True, gc=False, forbid_unknown_fields=forbid_unknown)

    histogram = struct("Histogram", [("count", Counts), ("tokens", Counts)])
    site = struct(
        "SyncSite", [("site", Annotated[str, msgspec.Meta(min_length=1, max_length=MAX_SITE_LENGTH)]), ("count", Count)]
    )
    syncs = struct(
        "Syncs",
        [
            *_fields_under(("syncs",), bounded),
            (
                "sites",
                Annotated[list[site], msgspec.Meta(max_length=MAX_SYNC_SITES)],  # type: ignore[valid-type]
                msgspec.field(default_factory=list),
            ),
        ],
    )
    gpu = struct("GpuStats", _fields_under(("gpu",), bounded))
    loss = Annotated[float, msgspec.Meta(ge=-FLOAT_MAX, le=FLOAT_MAX)] if bounded else float
    record = struct(
        "IntervalRecord",
        [
            *_fields_under((), bounded),
            ("syncs", syncs),
            ("histograms", struct("Histograms", [("documents", histogram), ("packs", histogram)])),
            ("gpu", gpu | None, None),
            ("channel_loss", dict[ChannelName, loss | None] | None, None),  # type: ignore[valid-type]
            # The tokens behind each channel's mean: what makes the means addable (rollups, charts).
            ("channel_tokens", dict[ChannelName, Count] | None, None),
        ],
    )
    intervals = Annotated[list[record], msgspec.Meta(min_length=1, max_length=MAX_BATCH)]  # type: ignore[valid-type]
    batch = struct("IntervalBatch", [("intervals", intervals)])
    return {"record": record, "gpu": gpu, "batch": batch}


Count = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
Counts = Annotated[list[Count], msgspec.Meta(min_length=NUM_BUCKETS, max_length=NUM_BUCKETS)]
ChannelName = Annotated[str, msgspec.Meta(max_length=MAX_CHANNEL_NAME)]
_BOUNDED = _types(forbid_unknown=True, bounded=True)
_STRICT, _LENIENT = _types(forbid_unknown=True), _types(forbid_unknown=False)
Record, Batch = _LENIENT["record"], _LENIENT["batch"]
_DECODERS = tuple(msgspec.json.Decoder(family["batch"]) for family in (_BOUNDED, _STRICT, _LENIENT))
# A missing `gpu` object reads as one whose readings are all missing, so one getter takes every
# catalogue field of a record in a single call (row_values).
NO_GPU = _LENIENT["gpu"]()

# Every catalogue field of a record, in catalogue order, in one C-level call.
row_values: Callable[[Any], tuple[Any, ...]] = operator.attrgetter(*(".".join(f.wire_path) for f in FIELDS))


def batch_json_schema() -> dict[str, Any]:
    """The batch's JSON schema (local references under "$defs"), for the OpenAPI document."""
    (schema,), components = msgspec.json.schema_components([Batch], ref_template="#/$defs/{name}")
    return {**schema, "$defs": components}


# -- decoding ---------------------------------------------------------------------------------------
_AT = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_STEP = re.compile(r"\.([A-Za-z_][A-Za-z0-9_]*)|\[(\d+)\]|\[(\"(?:[^\"\\]|\\.)*\")\]")


def _located(error: msgspec.ValidationError) -> tuple[Location, str, str]:
    """msgspec's message ("Expected `int` >= 1 - at `$.intervals[0].steps`") as a location and a message."""
    text = str(error)
    match = _AT.search(text)
    message = text[: match.start()] if match else text
    loc: list[str | int] = []
    for name, index, key in _STEP.findall(match["path"] if match else ""):
        loc.append(name or (int(index) if index else json.loads(key)))
    missing = re.match(r"Object missing required field `([^`]+)`", message)
    if missing:
        loc.append(missing[1])
        return tuple(loc), "Field required", "missing"
    return tuple(loc), message, "value_error"


class Checked(NamedTuple):
    """A checked batch: its records (the structs), the fields it sent that the record does not
    know, and every record's row values (row_values, as `check` left them)."""

    records: list[Any]
    ignored: list[str]
    values: list[tuple[Any, ...]]
    # The positions of the records whose loss arrived NaN or ±inf (stored as missing): the
    # nonfinite_loss alert's evidence (backend/alerts/rules.py).
    nonfinite_loss: tuple[int, ...] = ()


# A JSON number of magnitude below FLOAT_MIN (1e-300) but not 0 is written either with a negative
# exponent of three digits or more (e-100 and below) or with 200 zeros in a row (0.000…1e-99).
_ZEROS = b"0" * 200
assert FLOAT_MIN <= 1e-300, "the screen below holds for magnitudes below 1e-300 only"


def _no_tiny_numbers(body: bytes) -> bool:
    """True when no number in the JSON text can be nonzero and below FLOAT_MIN in magnitude: the
    usual batch, whose floats `check` then need not look at one by one. (A '-' is rare in a
    batch and found at C speed, so the usual batch costs two scans of its bytes.)"""
    if _ZEROS in body:
        return False
    at = body.find(b"-")
    while at != -1:
        exponent = body[at + 1 : at + 4]
        if body[at - 1 : at] in (b"e", b"E") and len(exponent) == 3 and exponent.isdigit():
            return False
        at = body.find(b"-", at + 1)
    return True


def decode(body: bytes) -> Checked:
    """A batch's JSON as checked records, and the fields it sent that the record does not know
    (`_decode`). JSON nested deeper than the decoders' recursion limit (about 1,000 levels: a
    record itself nests 4) is refused as such, wherever it is, a field the record does not know
    included."""
    try:
        return _decode(body)
    except RecursionError:
        message = "the body nests JSON too deeply to read (about 1,000 levels); an interval record nests 4"
        raise RecordError([((), message, "json_invalid")]) from None


def _decode(body: bytes) -> Checked:
    """A batch's JSON as checked records, and the fields it sent that the record does not know.

    The usual batch is decoded once, by the bounded structs, and its text screened for numbers too
    small to store (`_no_tiny_numbers`): `check` then judges what spans fields only. Any other is
    decoded again by the strict (or the lenient) structs and checked in full, which is what words
    its problems.

    JSON as Python's `json` writes it may hold NaN and Infinity (a diverged loss), and any JSON a
    number beyond a double's range (1e400, which msgspec refuses as out of range): such a body is
    read by `json` (1e400 is then inf) and converted to the same structs, with the same bounds; a
    diverged optional reading is then stored as missing, a diverged required one refused."""
    bounded, strict, lenient = _DECODERS
    ignored: list[str] = []
    readings_checked = True
    try:
        try:
            records: list[Any] = bounded.decode(body).intervals
        except msgspec.ValidationError:
            readings_checked = False
            try:
                records = strict.decode(body).intervals
            except msgspec.ValidationError as exc:
                if not str(exc).startswith("Object contains unknown field"):
                    raise
                records = lenient.decode(body).intervals
                ignored = unknown_fields(msgspec.json.decode(body))
    except msgspec.ValidationError as exc:
        if str(exc).startswith("Number out of range"):
            return _read_by_json(body)
        raise RecordError([_located(exc)]) from None
    except msgspec.DecodeError:
        return _read_by_json(body)
    nonfinite: list[int] = []
    values = check(
        records,
        strings_safe=b"\\u0000" not in body,  # msgspec refuses lone surrogates itself
        readings_checked=readings_checked and _no_tiny_numbers(body),
        nonfinite_loss=nonfinite,
    )
    return Checked(records, ignored, values, tuple(nonfinite))


def _read_by_json(body: bytes) -> Checked:
    """A body msgspec cannot read, read by Python's `json` and converted (see `_decode`)."""
    try:
        document = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise RecordError([((), f"the body is not JSON: {exc}", "json_invalid")]) from None
    return convert(document)._replace(ignored=unknown_fields(document))


def convert(document: Any) -> Checked:
    """Records built in Python (a batch `{"intervals": [...]}` of dicts) as checked records."""
    try:
        records: list[Any] = msgspec.convert(document, Batch).intervals
    except msgspec.ValidationError as exc:
        raise RecordError([_located(exc)]) from None
    except UnicodeEncodeError:  # msgspec cannot handle a lone surrogate (JSON read by `json` can hold one)
        loc = _unencodable_in(document)
        message = "the string holds a lone surrogate, which is not valid UTF-8"
        raise RecordError([(loc or (), message, "value_error")]) from None
    nonfinite: list[int] = []
    values = check(records, strings_safe=False, nonfinite_loss=nonfinite)
    return Checked(records, [], values, tuple(nonfinite))


def _encodes(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _unencodable_in(document: Any) -> Location | None:
    """Where the first string that UTF-8 cannot encode is, among the fields the record reads: a
    field it does not know is ignored, whatever it holds."""
    records = document.get("intervals") if isinstance(document, dict) else None
    if not isinstance(records, list):
        return _unencodable(document, (), None)
    for i, record in enumerate(records):
        if (found := _unencodable(record, ("intervals", i), _KNOWN)) is not None:
            return found
    return None


def _unencodable(value: Any, loc: Location, known: dict[str, Any] | None) -> Location | None:
    """The first string (key or value) in `value` that UTF-8 cannot encode; within a struct
    (`known`: its keys, as _KNOWN gives them), only in the keys it takes. A string with a NUL
    byte encodes: `check` names it later, with its own reason."""
    if isinstance(value, list):
        children = [(i, item, known) for i, item in enumerate(value)]  # a list's items: the same struct
    elif isinstance(value, dict):
        children = [
            (key, item, None if known is None else known[key])
            for key, item in value.items()
            if known is None or key in known
        ]
    else:
        return None
    for key, item, inner in children:
        if (isinstance(key, str) and not _encodes(key)) or (isinstance(item, str) and not _encodes(item)):
            return (*loc, key)
        if (found := _unencodable(item, (*loc, key), inner)) is not None:
            return found
    return None


# -- the checks across fields -----------------------------------------------------------------------
_AT_FIELD = {f.name: i for i, f in enumerate(FIELDS)}
_SPAN = operator.itemgetter(
    *(_AT_FIELD[n] for n in ("first_step", "last_step", "steps", "tokens", "real_tokens", "syncs_uncounted_steps"))
)
_WALL = operator.itemgetter(_AT_FIELD["wall_start"], _AT_FIELD["wall_end"])
# (position in row_values, wire path, lower, upper) of the optional readings, and the position of
# every float (each nonzero one must be at least FLOAT_MIN in magnitude).
_OPTIONAL = tuple(
    (i, f.wire_path, -f.upper if f.minimum is None else f.minimum, f.upper)
    for i, f in enumerate(FIELDS)
    if not f.required and f.kind == "float"
)
_FLOATS = tuple((i, f.wire_path) for i, f in enumerate(FIELDS) if f.kind == "float")
_LOSS_PATH = next(f.wire_path for f in FIELDS if f.name == "loss")


def _set(record: Any, path: tuple[str, ...], value: Any) -> None:
    holder = record
    for key in path[:-1]:
        holder = getattr(holder, key)
    setattr(holder, path[-1], value)


def _span_problem(first: int, last: int, steps: int, tokens: int, real: int, uncounted: int) -> str | None:
    if first > last:
        return f"first_step ({first}) is after last_step ({last})"
    if steps > last - first + 1:
        return f"steps ({steps}) is more than the {last - first + 1} steps from first_step to last_step"
    if uncounted > steps:
        return f"syncs.uncounted_steps ({uncounted}) is more than the interval's steps ({steps})"
    if real > tokens:
        return (
            f"real_tokens ({real}) exceeds tokens ({tokens}); tokens counts every slot the model ran, padding included"
        )
    return None


def _reading_problems(
    i: int, r: Any, values: tuple[Any, ...], problems: list[tuple[Location, str, str]], nonfinite_loss: list[int]
) -> bool:
    """The optional readings out of their bounds and the floats too small to store, added to
    `problems`; True when a reading diverged (it became None in place); `i` added to
    `nonfinite_loss` when the loss did."""
    diverged = False
    for at, path, lower, upper in _OPTIONAL:
        value = values[at]
        if value is None or lower <= value <= upper:
            continue
        if not -FLOAT_MAX <= value <= FLOAT_MAX:  # NaN, inf, beyond any real reading: diverged
            _set(r, path, None)
            diverged = True
            if path == _LOSS_PATH:
                nonfinite_loss.append(i)
        else:
            bound = f">= {lower}" if value < lower else f"<= {upper}"
            problems.append((("intervals", i, *path), f"Expected `float` {bound}", "value_error"))
    for at, path in _FLOATS:
        value = values[at]
        if value is not None and value != 0 and abs(value) < FLOAT_MIN:
            message = f"{value!r} is too small to store: send 0, or a magnitude of at least {FLOAT_MIN}"
            problems.append((("intervals", i, *path), message, "value_error"))
    if r.channel_loss:
        for channel, value in r.channel_loss.items():
            if value is not None and not -FLOAT_MAX <= value <= FLOAT_MAX:
                r.channel_loss[channel] = None  # diverged, as an optional reading
    return diverged


def _record_problems(
    i: int, r: Any, strings_safe: bool, readings_checked: bool, nonfinite_loss: list[int]
) -> tuple[list[tuple[Location, str, str]], tuple[Any, ...]]:
    """Every problem of record `i` (after the types and bounds msgspec checked), and its row
    values; diverged optional readings become None in place."""
    if r.gpu is None:
        r.gpu = NO_GPU
    problems: list[tuple[Location, str, str]] = []
    values = row_values(r)
    problem = _span_problem(*_SPAN(values))
    wall_start, wall_end = _WALL(values)
    if problem is None and wall_end < wall_start:
        problem = f"wall_end ({wall_end}) is before wall_start ({wall_start})"
    if problem:
        problems.append((("intervals", i), problem, "value_error"))
    if not readings_checked and _reading_problems(i, r, values, problems, nonfinite_loss):
        values = row_values(r)
    sites = r.syncs.sites
    if len(sites) > 1 and len({s.site for s in sites}) != len(sites):
        names = [s.site for s in sites]
        twice = next(name for at, name in enumerate(names) if name in names[:at])
        message = f"sync site {twice!r} is listed twice; send each site once with its total"
        problems.append((("intervals", i, "syncs", "sites"), message, "value_error"))
    if not strings_safe:
        for j, s in enumerate(sites):
            if problem := text_problem(s.site):
                problems.append((("intervals", i, "syncs", "sites", j, "site"), f"the string {problem}", "value_error"))
        for part in ("channel_loss", "channel_tokens"):
            for name in getattr(r, part) or ():
                if problem := text_problem(name):
                    problems.append((("intervals", i, part, name), f"the channel name {problem}", "value_error"))
    return problems, values


def check(
    records: Sequence[Any],
    *,
    strings_safe: bool,
    readings_checked: bool = False,
    nonfinite_loss: list[int] | None = None,
) -> list[tuple[Any, ...]]:
    """Check what spans fields, for every record (raising one RecordError naming every problem);
    diverged optional readings become None in place. `strings_safe`: the caller knows no string
    holds a NUL byte or a lone surrogate, so the strings are not walked. `readings_checked`: the
    caller knows every optional reading (channel losses included) is within its bounds and no
    float is nonzero below FLOAT_MIN, so the readings are not walked. Every record's row values,
    read once here for the checks and the rows alike; the positions of the records whose loss
    diverged are added to `nonfinite_loss`."""
    diverged: list[int] = [] if nonfinite_loss is None else nonfinite_loss
    problems: list[tuple[Location, str, str]] = []
    values: list[tuple[Any, ...]] = []
    for i, r in enumerate(records):
        found, row = _record_problems(i, r, strings_safe, readings_checked, diverged)
        problems += found
        values.append(row)
    if problems:
        raise RecordError(problems)
    return values


# -- fields the record does not know ------------------------------------------------------------------
def _known(struct: Any) -> dict[str, Any]:
    """The keys a struct takes, each with the known keys of its value (None: any keys)."""
    out: dict[str, Any] = {}
    for f in msgspec.structs.fields(struct):
        inner = _struct_in(f.type)
        out[f.encode_name] = None if inner is None else _known(inner)
    return out


def _struct_in(t: Any) -> Any:
    """The struct a field holds (itself, in an Optional, or as a list's items), else None."""
    while getattr(t, "__metadata__", None) is not None:  # Annotated[...]
        t = t.__origin__
    if isinstance(t, type) and issubclass(t, msgspec.Struct):
        return t
    for member in getattr(t, "__args__", ()):
        if (found := _struct_in(member)) is not None:
            return found
    return None


_KNOWN = _known(_LENIENT["record"])


def _unknown(value: Any, known: dict[str, Any] | None, path: str, out: set[str]) -> None:
    if known is None:
        return
    for item in value if isinstance(value, list) else (value,):
        if isinstance(item, dict):
            for key, inner in item.items():
                if key in known:
                    _unknown(inner, known[key], f"{path}{key}.", out)
                else:
                    out.add(path + key)


def unknown_fields(document: Any) -> list[str]:
    """The dotted paths of the fields a decoded batch holds that the record does not know, sorted."""
    out: set[str] = set()
    for record in document.get("intervals", ()) if isinstance(document, dict) else ():
        _unknown(record, _KNOWN, "", out)
    return sorted(out)
