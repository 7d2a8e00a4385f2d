"""The interval table's row layout: a validated wire record (a dict, as schemas.parse_batch
returns it) as one row tuple (ROW_COLUMNS order), read field by field from its place on the wire
as the catalogue says."""

import json
import operator
from collections.abc import Callable, Sequence
from typing import Any

from pydantic_core import to_json

from packscope.backend.models import intervals
from packscope.backend.schemas import Record
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
ROW_COLUMNS = tuple(name for name in intervals.columns.keys() if name != "id")  # noqa: SIM118
COLUMN_AT = {name: i for i, name in enumerate(ROW_COLUMNS)}
FIELD_SLICE = slice(COLUMN_AT[FIELDS[0].name], COLUMN_AT[FIELDS[-1].name] + 1)  # the catalogue fields of a row
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
