"""The interval record of the wire contract (docs/wire.md): its decoders and its checks across fields.

Unknown fields are ignored rather than rejected, so a newer agent can still talk to this server.
"""

import operator
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated, Any

import msgspec
import numpy as np
from pydantic import BaseModel, Field, TypeAdapter, ValidationError, create_model
from pydantic_core import InitErrorDetails
from typing_extensions import TypedDict

from packscope.backend.text import text_problem
from packscope.core.catalogue import FIELDS, FLOAT_MAX, INT64_MAX
from packscope.core.catalogue import Field as CatalogueField
from packscope.core.histograms import NUM_BUCKETS

MAX_BATCH = 1000
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]


# -- interval records -----------------------------------------------------------------------------
# The scalar fields come from the catalogue (packscope/core/catalogue.py); only the nested,
# non-scalar parts of a record are written out here.
#
# Validation runs in two steps, neither of which calls Python per field:
# * pydantic-core parses and checks each value against its constraints (types, bounds, lengths)
#   straight from the raw JSON into plain dicts (`parse_batch`, through `RECORDS`);
# * `check_records` then checks what spans fields or records with numpy over the whole batch
#   (first_step <= last_step, steps within the span, real_tokens <= tokens, wall_end >= wall_start),
#   stores optional readings that diverged as missing, bounds the remaining optional readings, and
#   refuses a sync site listed twice. Its errors are pydantic's, naming the record and the field.
# The BaseModel classes below describe the same record for the OpenAPI document and for callers
# that build records in Python; `ingest_batch` runs `check_records` on them too.
def _field_type(f: CatalogueField) -> Any:
    """The pydantic type of a catalogue field: strict (no "1024" or true for a number), bounded.

    An optional float is only typed here: a reading that diverged (NaN, inf, beyond FLOAT_MAX) is
    stored as missing rather than refusing the batch, so its bounds are checked in check_records."""
    lower = f.minimum if f.minimum is not None else -f.upper
    if f.kind == "int":
        return Annotated[int, Field(strict=True, ge=lower, le=f.upper, description=f.doc)]
    if not f.required:
        return Annotated[float, Field(strict=True, description=f.doc)]
    return Annotated[float, Field(strict=True, ge=lower, le=f.upper, allow_inf_nan=False, description=f.doc)]


def _model_fields(fields: list[CatalogueField]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for f in fields:
        key = f.wire_path[-1]
        out[key] = (_field_type(f), ...) if f.required else (_field_type(f) | None, None)
    return out


def _typed_dict_fields(fields: list[CatalogueField]) -> dict[str, Any]:
    return {
        f.wire_path[-1]: _field_type(f) if f.required else Annotated[_field_type(f) | None, Field(default=None)]
        for f in fields
    }


def _on_wire(prefix: str) -> list[CatalogueField]:
    return [f for f in FIELDS if f.wire_path[:-1] == ((prefix,) if prefix else ())]


# Sync sites and channel names may not hold NUL bytes: parse_batch looks for the escape in the raw
# body and check_records looks at the strings only when it is there. (A lone surrogate is already
# invalid JSON to pydantic-core.)
SiteName = Annotated[str, Field(min_length=1, max_length=500)]
ChannelName = Annotated[str, Field(max_length=100)]
HistogramCounts = Annotated[list[Count], Field(min_length=NUM_BUCKETS, max_length=NUM_BUCKETS)]
# Channel means are taken as they were before (lax floats); NaN, inf and beyond FLOAT_MAX become null.
ChannelLoss = dict[ChannelName, float | None]
ChannelTokens = dict[ChannelName, Annotated[int, Field(strict=True, ge=0, le=INT64_MAX)]]


class Histogram(BaseModel):
    count: HistogramCounts
    tokens: HistogramCounts


class Histograms(BaseModel):
    documents: Histogram
    packs: Histogram  # a pack's length is its real tokens


class SyncSite(BaseModel):
    site: SiteName
    count: Count


class SyncsBase(BaseModel):
    # v1 agents also send `per_iteration`; it is total / steps and derived by the server, so it is
    # accepted and ignored. Each site once (check_records).
    sites: list[SyncSite] = Field(default_factory=list, max_length=100)


class IntervalRecordBase(BaseModel):
    """What the catalogue's scalar fields do not cover; the checks across fields are check_records'."""

    syncs: SyncsBase
    histograms: Histograms
    channel_loss: ChannelLoss | None = None
    # Tokens behind each channel's mean loss: what makes the means addable (rollups, charts).
    channel_tokens: ChannelTokens | None = None


if TYPE_CHECKING:  # the type checker sees the generated classes as their bases
    Syncs = SyncsBase
    GpuStats = BaseModel
    IntervalRecord = IntervalRecordBase
else:
    Syncs = create_model("Syncs", __base__=SyncsBase, **_model_fields(_on_wire("syncs")))
    GpuStats = create_model("GpuStats", **_model_fields(_on_wire("gpu")))
    IntervalRecord = create_model(
        "IntervalRecord",
        __base__=IntervalRecordBase,
        syncs=(Syncs, ...),
        gpu=(GpuStats | None, None),
        **_model_fields(_on_wire("")),
    )


class IntervalBatch(BaseModel):
    intervals: list[IntervalRecord] = Field(min_length=1, max_length=MAX_BATCH)


# The same record as plain dicts (what parse_batch returns): no model instance per object.
class _HistogramDict(TypedDict):
    count: HistogramCounts
    tokens: HistogramCounts


class _SyncSiteDict(TypedDict):
    site: SiteName
    count: Count


# Built from the catalogue at import time; the type checker sees Record, a plain dict.
_typed_dict: Any = TypedDict
_SyncsDict = _typed_dict(
    "_SyncsDict",
    {
        "sites": Annotated[list[_SyncSiteDict], Field(default_factory=list, max_length=100)],
        **_typed_dict_fields(_on_wire("syncs")),
    },
)
_RecordDict: Any = _typed_dict(
    "_RecordDict",
    {
        **_typed_dict_fields(_on_wire("")),
        "syncs": _SyncsDict,
        "histograms": _typed_dict("_HistogramsDict", {"documents": _HistogramDict, "packs": _HistogramDict}),
        "gpu": Annotated[_typed_dict("_GpuDict", _typed_dict_fields(_on_wire("gpu"))) | None, Field(default=None)],
        "channel_loss": Annotated[ChannelLoss | None, Field(default=None)],
        "channel_tokens": Annotated[ChannelTokens | None, Field(default=None)],
    },
)
RECORDS: TypeAdapter[dict[str, list[dict[str, Any]]]] = TypeAdapter(
    _typed_dict(
        "IntervalBatchDict", {"intervals": Annotated[list[_RecordDict], Field(min_length=1, max_length=MAX_BATCH)]}
    )
)
Record = dict[str, Any]  # a record as parse_batch returns it (the wire's nesting, optional parts None)


def _error(loc: tuple[str | int, ...], message: str, value: Any = None) -> InitErrorDetails:
    return {"type": "value_error", "loc": loc, "input": value, "ctx": {"error": ValueError(message)}}


# The fields check_records compares, as one getter each for the ints and the floats.
_SPAN_INTS = ("first_step", "last_step", "steps", "tokens", "real_tokens")
_GET_SPAN_INTS = operator.itemgetter(*_SPAN_INTS)
_GET_WALL = operator.itemgetter("wall_start", "wall_end")


class _Optional:
    """The optional float readings of one object of the record (the record itself, or `gpu`):
    their keys, one getter for all of them, and their catalogue bounds as vectors."""

    def __init__(self, parent: str, fields: list[CatalogueField]) -> None:
        self.parent = parent
        self.keys = tuple(f.wire_path[-1] for f in fields)
        self.get = operator.itemgetter(*self.keys) if len(fields) > 1 else (lambda obj: (obj[self.keys[0]],))
        self.lower = np.array([-f.upper if f.minimum is None else f.minimum for f in fields], dtype=float)
        self.upper = np.array([f.upper for f in fields], dtype=float)


_OPTIONAL = tuple(
    _Optional(parent, fields)
    for parent in ("", *sorted({f.wire_path[0] for f in FIELDS if len(f.wire_path) > 1}))
    if (fields := [f for f in _on_wire(parent) if not f.required and f.kind == "float"])
)


def _cross_field_errors(records: Sequence[Record]) -> list[InitErrorDetails]:
    ints = np.array([_GET_SPAN_INTS(r) for r in records], dtype=np.int64).reshape(len(records), len(_SPAN_INTS))
    first, last, steps, tokens, real = ints.T
    walls = np.array([_GET_WALL(r) for r in records], dtype=float).reshape(len(records), 2)
    # last - first cannot overflow once first <= last (both are within 0..INT64_MAX).
    reversed_steps = first > last
    too_many = ~reversed_steps & (steps - 1 > np.where(reversed_steps, 0, last - first))
    bad = reversed_steps | too_many | (real > tokens) | (walls[:, 1] < walls[:, 0])
    errors: list[InitErrorDetails] = []
    for i in np.flatnonzero(bad).tolist():
        r = records[i]
        if r["first_step"] > r["last_step"]:
            message = f"first_step ({r['first_step']}) is after last_step ({r['last_step']})"
        elif r["steps"] > (span := r["last_step"] - r["first_step"] + 1):
            message = f"steps ({r['steps']}) is more than the {span} steps from first_step to last_step"
        elif r["real_tokens"] > r["tokens"]:
            message = (
                f"real_tokens ({r['real_tokens']}) exceeds tokens ({r['tokens']}); "
                "tokens counts every slot the model ran, padding included"
            )
        else:
            message = f"wall_end ({r['wall_end']}) is before wall_start ({r['wall_start']})"
        errors.append(_error(("intervals", i), message))
    return errors


def _optional_reading_errors(records: Sequence[Record]) -> list[InitErrorDetails]:
    """Readings that diverged (NaN, inf, beyond FLOAT_MAX) become None in place; finite ones out of
    their catalogue bounds are errors. One matrix per object that holds optional readings."""
    errors: list[InitErrorDetails] = []
    for group in _OPTIONAL:
        if group.parent:
            at = [i for i, r in enumerate(records) if r[group.parent] is not None]
            holders = [records[i][group.parent] for i in at]
        else:
            at, holders = list(range(len(records))), list(records)
        if not holders:
            continue
        values = np.array([group.get(h) for h in holders], dtype=float)  # None -> NaN
        finite = np.abs(values) <= FLOAT_MAX  # False for NaN (and so None) and inf
        if not finite.all():
            for row, column in np.argwhere(~finite).tolist():
                holders[row][group.keys[column]] = None
        bad = finite & ((values < group.lower) | (values > group.upper))
        for row, column in np.argwhere(bad).tolist():
            key, value = group.keys[column], values[row, column].item()
            lower, upper = group.lower[column].item(), group.upper[column].item()
            bound = ("greater_than_equal", {"ge": lower}) if value < lower else ("less_than_equal", {"le": upper})
            loc = ("intervals", at[row], group.parent, key) if group.parent else ("intervals", at[row], key)
            errors.append({"type": bound[0], "loc": loc, "input": value, "ctx": bound[1]})
    for r in records:
        losses = r["channel_loss"]
        if losses:
            for channel, value in losses.items():
                if value is not None and not abs(value) <= FLOAT_MAX:
                    losses[channel] = None
    return errors


def _text_errors(records: Sequence[Record]) -> list[InitErrorDetails]:
    errors: list[InitErrorDetails] = []
    for i, r in enumerate(records):
        for j, s in enumerate(r["syncs"]["sites"]):
            if problem := text_problem(s["site"]):
                errors.append(_error(("intervals", i, "syncs", "sites", j, "site"), f"the string {problem}"))
        for part in ("channel_loss", "channel_tokens"):
            for name in r[part] or ():
                if problem := text_problem(name):
                    errors.append(_error(("intervals", i, part, name), f"the channel name {problem}"))
    return errors


def check_records(records: Sequence[Record], *, strings_checked: bool = False) -> list[dict[str, int]]:
    """Check what spans fields or records, for the whole batch at once, and store diverged optional
    readings as missing (in place). Returns each record's sync sites as {site: count}. Raises
    pydantic's ValidationError naming the record (and the field) of every problem.

    `strings_checked`: the caller knows no string holds a NUL byte (parse_batch found no escape for
    one in the raw body), so the strings are not walked."""
    errors = _cross_field_errors(records) + _optional_reading_errors(records)
    if not strings_checked:
        errors += _text_errors(records)
    sites = []
    for i, r in enumerate(records):
        listed = r["syncs"]["sites"]
        by_site = {s["site"]: s["count"] for s in listed}
        if len(by_site) != len(listed):
            names = [s["site"] for s in listed]
            twice = next(name for at, name in enumerate(names) if name in names[:at])
            message = f"sync site {twice!r} is listed twice; send each site once with its total"
            errors.append(_error(("intervals", i, "syncs", "sites"), message))
        sites.append(by_site)
    if errors:
        errors.sort(key=lambda e: e["loc"][1])
        raise ValidationError.from_exception_data("IntervalBatch", errors)
    return sites


def parse_batch(body: bytes) -> tuple[list[Record], list[dict[str, int]]]:
    """A raw JSON batch validated as plain dicts (see above); (records, their sync sites).
    Raises pydantic's ValidationError, locations rooted at the batch (("intervals", i, ...))."""
    records: list[Record] = RECORDS.validate_json(body)["intervals"]
    return records, check_records(records, strings_checked=b"\\u0000" not in body)


# -- the hot path: msgspec ------------------------------------------------------------------------
# The route decodes a batch with msgspec straight into typed structs with the same constraints
# (generated from the catalogue as the pydantic schema is), which costs a fraction of building
# pydantic-core's dicts. It is at least as strict as the pydantic schema: whatever it refuses, or
# any batch whose checks across fields fail, is parsed again by `parse_batch`, which accepts what
# the schema accepts and names every problem in pydantic's 422 format. So the answers for bad input
# are the pydantic path's, word for word, and a good batch is stored with the same values.
def _struct_type(f: CatalogueField) -> Any:
    lower = f.minimum if f.minimum is not None else -f.upper
    if f.kind == "int":
        return Annotated[int, msgspec.Meta(ge=lower, le=f.upper)]
    if not f.required:  # bounds checked afterwards: beyond them a reading diverged (stored as missing)
        return float
    return Annotated[float, msgspec.Meta(ge=lower, le=f.upper)]


def _struct_fields(fields: list[CatalogueField]) -> list[tuple[Any, ...]]:
    return [
        (f.wire_path[-1], _struct_type(f)) if f.required else (f.wire_path[-1], _struct_type(f) | None, None)
        for f in fields
    ]


def _struct(name: str, fields: list[tuple[Any, ...]]) -> Any:
    # gc=False: a decoded record holds no reference cycles, so the collector need not track it.
    return msgspec.defstruct(name, fields, kw_only=True, gc=False)


_I64 = Annotated[int, msgspec.Meta(ge=0, le=INT64_MAX)]
_COUNTS = Annotated[list[_I64], msgspec.Meta(min_length=NUM_BUCKETS, max_length=NUM_BUCKETS)]
_CHANNEL = Annotated[str, msgspec.Meta(max_length=100)]
_HistogramStruct = _struct("Histogram", [("count", _COUNTS), ("tokens", _COUNTS)])
HistogramsStruct = _struct("Histograms", [("documents", _HistogramStruct), ("packs", _HistogramStruct)])
_SiteStruct = _struct(
    "SyncSite", [("site", Annotated[str, msgspec.Meta(min_length=1, max_length=500)]), ("count", _I64)]
)
_SyncsStruct = _struct(
    "Syncs",
    [
        ("sites", Annotated[list[_SiteStruct], msgspec.Meta(max_length=100)], msgspec.field(default_factory=list)),  # type: ignore[valid-type]
        *_struct_fields(_on_wire("syncs")),
    ],
)
_GpuStruct = _struct("GpuStats", _struct_fields(_on_wire("gpu")))
RecordStruct = _struct(
    "IntervalRecord",
    [
        *_struct_fields(_on_wire("")),
        ("syncs", _SyncsStruct),
        ("histograms", HistogramsStruct),
        ("gpu", _GpuStruct | None, None),
        ("channel_loss", dict[_CHANNEL, float | None] | None, None),
        ("channel_tokens", dict[_CHANNEL, _I64] | None, None),
    ],
)
_BATCH_DECODER = msgspec.json.Decoder(
    _struct(
        "IntervalBatch",
        [("intervals", Annotated[list[RecordStruct], msgspec.Meta(min_length=1, max_length=MAX_BATCH)])],  # type: ignore[valid-type]
    )
)
# (attribute path, lower, upper) of every optional float reading.
_OPTIONAL_READINGS = tuple(
    (f.wire_path, -f.upper if f.minimum is None else f.minimum, f.upper)
    for f in FIELDS
    if not f.required and f.kind == "float"
)


def _plain_check() -> Callable[[Any], bool]:
    """A function of a RecordStruct: True when its fields agree (check_records' checks across
    fields) and every optional reading is present and within its bounds, or missing. Built once
    from the catalogue as one boolean expression, so a clean record costs a few comparisons."""
    optional_parents = sorted({path[:-1] for path, _, _ in _OPTIONAL_READINGS if len(path) > 1})
    terms = [
        "r.first_step <= r.last_step",
        "r.steps - 1 <= r.last_step - r.first_step",
        "r.real_tokens <= r.tokens",
        "r.wall_start <= r.wall_end",  # never NaN: msgspec's JSON has no NaN
    ]
    for path, lower, upper in _OPTIONAL_READINGS:
        value = ("_".join(path[:-1]) + "." if len(path) > 1 else "r.") + path[-1]
        term = f"({value} is None or {lower!r} <= {value} <= {upper!r})"
        terms.append(f"({'_'.join(path[:-1])} is None or {term})" if len(path) > 1 else term)
    lines = [f"    {'_'.join(p)} = r.{'.'.join(p)}\n" for p in optional_parents]
    source = "def fine(r):\n" + "".join(lines) + "    return " + " and ".join(terms) + "\n"
    namespace: dict[str, Any] = {}
    exec(compile(source, "<schemas.fine>", "exec"), namespace)  # generated from the catalogue
    return namespace["fine"]


_FINE = _plain_check()


def _diverged_to_missing(r: Any) -> bool:
    """A record _FINE refused: its diverged optional readings (beyond ±FLOAT_MAX) become None;
    False when a finite reading is out of bounds (a 422)."""
    for path, lower, upper in _OPTIONAL_READINGS:
        holder = r
        for key in path[:-1]:
            holder = getattr(holder, key)
        value = None if holder is None else getattr(holder, path[-1])
        if value is not None and not lower <= value <= upper:
            if -FLOAT_MAX <= value <= FLOAT_MAX:
                return False
            setattr(holder, path[-1], None)
    return True


def _structs_pass(records: list[Any]) -> bool:
    """The checks of check_records on decoded structs: True when every record passes (diverged
    optional readings are then stored as missing, in place), False when any check fails (the
    caller parses the batch again with parse_batch, which names the problems)."""
    for r in records:
        if not _FINE(r) and not (_diverged_to_missing(r) and _FINE(r)):
            return False
        sites = r.syncs.sites
        if len(sites) > 1 and len({s.site for s in sites}) != len(sites):
            return False
        losses = r.channel_loss
        if losses:
            for channel, value in losses.items():
                if value is not None and not -FLOAT_MAX <= value <= FLOAT_MAX:
                    losses[channel] = None
    return True


def decode_batch(body: bytes) -> list[Any] | None:
    """The batch's records as RecordStructs, checked as parse_batch checks them, or None when the
    fast decoder refuses it or any check fails (the caller then uses parse_batch). A body with an
    escaped NUL byte always takes parse_batch's way (its strings need text_problem's checks)."""
    if b"\\u0000" in body:
        return None
    try:
        records: list[Any] = _BATCH_DECODER.decode(body).intervals
    except msgspec.MsgspecError:
        return None
    return records if _structs_pass(records) else None
