"""The interval table's row layout: a validated wire record as one row tuple (ROW_COLUMNS order),
read field by field from its place on the wire as the catalogue says."""

import json
import operator
from collections.abc import Callable, Sequence
from typing import Any

from packscope.backend.models import intervals
from packscope.backend.schemas import IntervalRecord
from packscope.core.catalogue import FIELDS, Field


def _wire_groups() -> list[tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]], tuple[str, ...]]]:
    """(parent path, getter of its values, field names) per object of the wire record that holds
    catalogue fields: one C-level attrgetter call per object instead of a getattr per field."""
    by_parent: dict[tuple[str, ...], list[Field]] = {}
    for f in FIELDS:
        by_parent.setdefault(f.wire_path[:-1], []).append(f)
    groups: list[tuple[tuple[str, ...], Callable[[Any], tuple[Any, ...]], tuple[str, ...]]] = []
    for parent, fields in by_parent.items():
        get = operator.attrgetter(*(f.wire_path[-1] for f in fields))
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


def interval_row(run_pk: int, r: IntervalRecord) -> tuple[Any, ...]:
    """The record's table row in ROW_COLUMNS order: every catalogue field, read from its place on
    the wire (None where an optional object is missing), and channel_loss and channel_tokens as JSON text."""
    values: list[Any] = [run_pk]
    for parent, get, names in _WIRE_GROUPS:
        obj: Any = r
        for key in parent:
            obj = getattr(obj, key)
        values.extend((None,) * len(names) if obj is None else get(obj))
    values.append(None if r.channel_loss is None else json.dumps(r.channel_loss, sort_keys=True))
    values.append(None if r.channel_tokens is None else json.dumps(r.channel_tokens, sort_keys=True))
    return _TO_ROW_ORDER(values)


def row_key(row: Sequence[Any]) -> Key:
    return row[COLUMN_AT["interval"]], row[COLUMN_AT["rank"]]


def sync_sites_of(r: IntervalRecord) -> dict[str, int]:
    return {s.site: s.count for s in r.syncs.sites}
