"""The interval table's row layout: a validated wire record (a RecordStruct, as
schemas.decode_batch returns it, or a dict, as schemas.parse_batch does) as one row tuple
(ROW_COLUMNS order), read field by field from its place on the wire as the catalogue says; and a
whole batch as `Parsed`, what ingest stores."""

import json
import operator
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import msgspec
from pydantic_core import to_json

from packscope.backend.ingest.record import Record, check_records, decode_batch, parse_batch
from packscope.backend.store.models import COLUMN_AT, ROW_COLUMNS
from packscope.core.catalogue import FIELDS, Field


def _wire_groups() -> list[tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]], tuple[str, ...]]]:
    """(parent path, getter of its values, field names) per object of the wire record that holds
    catalogue fields: one C-level itemgetter call per object instead of a lookup per field."""
    by_parent: dict[tuple[str, ...], list[Field]] = {}
    for f in FIELDS:
        by_parent.setdefault(f.wire_path[:-1], []).append(f)
    groups: list[tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]], tuple[str, ...]]] = []
    for parent, fields in by_parent.items():
        get = operator.itemgetter(*(f.wire_path[-1] for f in fields))
        as_tuple = get if len(fields) > 1 else (lambda obj, one=get: (one(obj),))  # one name: a bare value
        groups.append((parent, as_tuple, tuple(f.name for f in fields)))
    return groups


_WIRE_GROUPS = _wire_groups()
# The columns of an inserted interval row: the table's, without the generated id.
# From the values in the order interval_row gathers them to ROW_COLUMNS order.
_GATHERED = ("run_pk", *(name for _, _, names in _WIRE_GROUPS for name in names), "channel_loss", "channel_tokens")
_TO_ROW_ORDER = operator.itemgetter(*(_GATHERED.index(name) for name in ROW_COLUMNS))
Key = tuple[int, int]  # (interval, rank)


def _json_text(value: dict[str, Any] | None) -> str | None:
    # The text the CSV export shows: keys sorted, so equal values are equal text.
    return None if value is None else json.dumps(value, sort_keys=True)


def interval_row(run_pk: int, r: Record) -> tuple[Any, ...]:
    """The record's table row in ROW_COLUMNS order: every catalogue field, read from its place on
    the wire (None where an optional object is missing), and channel_loss and channel_tokens as JSON text."""
    values: list[Any] = [run_pk]
    for parent, get, names in _WIRE_GROUPS:
        obj: Any = r
        for key in parent:
            obj = obj[key]
        values.extend((None,) * len(names) if obj is None else get(obj))
    values.append(_json_text(r["channel_loss"]))
    values.append(_json_text(r["channel_tokens"]))
    return _TO_ROW_ORDER(values)


def histograms_json(r: Record) -> str:
    """The record's length histograms as the JSON text interval_details stores."""
    return to_json(r["histograms"]).decode()


def row_key(row: Sequence[Any]) -> Key:
    return row[COLUMN_AT["interval"]], row[COLUMN_AT["rank"]]


# -- a batch, ready to store ----------------------------------------------------------------------
assert ROW_COLUMNS[0] == "run_pk"  # Parsed.values holds the rest, run_pk is known when it is stored


def _values_function() -> Callable[[Any], tuple[Any, ...]]:
    """A function of a RecordStruct giving its ROW_COLUMNS values after run_pk, built once from
    the catalogue as one tuple expression: no Python work per field beyond an attribute load."""
    parents = sorted({f.wire_path[:-1] for f in FIELDS if len(f.wire_path) > 1})
    optional = [p for p in parents if not all(f.required for f in FIELDS if f.wire_path[:-1] == p)]
    by_column = {f.name: f.wire_path for f in FIELDS}

    def expression(name: str) -> str:
        if name in ("channel_loss", "channel_tokens"):
            return f"_json_text(r.{name})"
        path = by_column[name]
        if path[:-1] in optional:  # an optional object (gpu): None when it is missing
            holder = "_".join(path[:-1])
            return f"(None if {holder} is None else {holder}.{path[-1]})"
        return "r." + ".".join(path)

    lines = [f"    {'_'.join(p)} = r.{'.'.join(p)}" for p in optional]
    body = ", ".join(expression(name) for name in ROW_COLUMNS[1:])
    source = "def values(r):\n" + "".join(line + "\n" for line in lines) + f"    return ({body},)\n"
    namespace: dict[str, Any] = {"_json_text": _json_text}
    exec(compile(source, "<rows.values>", "exec"), namespace)  # generated from the catalogue
    return namespace["values"]


_STRUCT_VALUES = _values_function()
_HISTOGRAMS = msgspec.json.Encoder()
_GET_KEY = operator.itemgetter(COLUMN_AT["interval"] - 1, COLUMN_AT["rank"] - 1)


Channels = tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]  # (channel_loss, channel_tokens)


class Parsed:
    """A validated batch: per record, its row values after run_pk (ROW_COLUMNS[1:] order), its
    length histograms as the JSON text interval_details stores, its sync sites {site: count}, and
    its channel_loss and channel_tokens as decoded (the row holds their JSON text, which the
    channel rollups would otherwise parse back)."""

    __slots__ = ("channels", "histograms", "sites", "values")

    def __init__(
        self,
        values: list[tuple[Any, ...]],
        histograms: list[str],
        sites: list[Mapping[str, int]],
        channels: list[Channels],
    ) -> None:
        self.values, self.histograms, self.sites, self.channels = values, histograms, sites, channels

    def __len__(self) -> int:
        return len(self.values)

    def keys(self) -> list[Key]:
        """Every record's key, in order."""
        return list(map(_GET_KEY, self.values))

    @classmethod
    def joined(cls, parts: Sequence["Parsed"]) -> "Parsed":
        return cls(
            [v for p in parts for v in p.values],
            [h for p in parts for h in p.histograms],
            [s for p in parts for s in p.sites],
            [c for p in parts for c in p.channels],
        )

    @classmethod
    def from_records(cls, records: Sequence[Record], sites: Sequence[Mapping[str, int]]) -> "Parsed":
        """From records that check_records passed (dicts, as parse_batch gives them)."""
        return cls(
            [interval_row(0, r)[1:] for r in records],
            [histograms_json(r) for r in records],
            list(sites),
            [(r["channel_loss"], r["channel_tokens"]) for r in records],
        )


def parse(body: bytes) -> Parsed:
    """A raw JSON batch validated and laid out as rows: msgspec's typed decode when the batch is
    clean (schemas.decode_batch), parse_batch otherwise, which raises pydantic's ValidationError
    naming every problem (locations rooted at the batch: ("intervals", i, ...))."""
    records = decode_batch(body)
    if records is None:
        return Parsed.from_records(*parse_batch(body))
    encode = _HISTOGRAMS.encode
    return Parsed(
        [_STRUCT_VALUES(r) for r in records],
        [encode(r.histograms).decode() for r in records],
        [{s.site: s.count for s in r.syncs.sites} for r in records],
        [(r.channel_loss, r.channel_tokens) for r in records],
    )


def parsed_records(records: Sequence[Record]) -> Parsed:
    """Records built in Python (dicts with every key, as parse_batch gives them), checked as the
    route checks them (check_records raises pydantic's ValidationError)."""
    return Parsed.from_records(records, check_records(records))
