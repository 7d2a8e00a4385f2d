"""A checked batch (ingest/record.py) laid out as what ingest stores: per record its interval row
(store/models.py's ROW_COLUMNS after run_pk: every catalogue field, then the channels' JSON text),
its length histograms as the JSON text interval_details stores, its sync sites {site: count}, and
its channel_loss and channel_tokens as decoded (for the channel rollups)."""

import json
import operator
from collections.abc import Mapping, Sequence
from typing import Any

import msgspec

from packscope.backend.ingest.record import Checked, convert, decode
from packscope.backend.store.models import COLUMN_AT, ROW_COLUMNS
from packscope.core.catalogue import FIELDS

assert ("run_pk", *(f.name for f in FIELDS), "channel_loss", "channel_tokens") == ROW_COLUMNS, ROW_COLUMNS
Key = tuple[int, int]  # (interval, rank)
Channels = tuple[Mapping[str, Any] | None, Mapping[str, Any] | None]  # (channel_loss, channel_tokens)
_HISTOGRAMS = msgspec.json.Encoder()
_GET_KEY = operator.itemgetter(COLUMN_AT["interval"] - 1, COLUMN_AT["rank"] - 1)


def _json_text(value: Mapping[str, Any] | None) -> str | None:
    # The text the CSV export shows: keys sorted, so equal values are equal text.
    return None if value is None else json.dumps(value, sort_keys=True)


def row_key(row: Sequence[Any]) -> Key:
    """(interval, rank) of a ROW_COLUMNS row."""
    return row[COLUMN_AT["interval"]], row[COLUMN_AT["rank"]]


class Parsed:
    """A checked batch, ready to store: per record its row values after run_pk, its histograms'
    JSON text, its sync sites and its channels as decoded. `ignored`: the fields the batch sent
    that the record does not know."""

    __slots__ = ("channels", "histograms", "ignored", "nonfinite_loss", "sites", "values")

    def __init__(
        self,
        values: list[tuple[Any, ...]],
        histograms: list[str],
        sites: list[Mapping[str, int]],
        channels: list[Channels],
        ignored: Sequence[str] = (),
        nonfinite_loss: Sequence[int] = (),
    ) -> None:
        self.values, self.histograms, self.sites, self.channels = values, histograms, sites, channels
        self.ignored = list(ignored)
        self.nonfinite_loss = tuple(nonfinite_loss)  # positions whose loss arrived NaN or ±inf

    def __len__(self) -> int:
        return len(self.values)

    def keys(self) -> list[Key]:
        """Every record's key, in order."""
        return list(map(_GET_KEY, self.values))

    @classmethod
    def of(cls, checked: Checked) -> "Parsed":
        """From a checked batch (ingest/record.py)."""
        records, encode = checked.records, _HISTOGRAMS.encode
        return cls(
            [
                (*values, _json_text(r.channel_loss), _json_text(r.channel_tokens))
                for r, values in zip(records, checked.values, strict=True)
            ],
            [encode(r.histograms).decode() for r in records],
            [{s.site: s.count for s in r.syncs.sites} for r in records],
            [(r.channel_loss, r.channel_tokens) for r in records],
            checked.ignored,
            checked.nonfinite_loss,
        )

    @classmethod
    def joined(cls, parts: Sequence["Parsed"]) -> "Parsed":
        starts = [0]
        for p in parts:
            starts.append(starts[-1] + len(p))
        return cls(
            [v for p in parts for v in p.values],
            [h for p in parts for h in p.histograms],
            [s for p in parts for s in p.sites],
            [c for p in parts for c in p.channels],
            sorted({name for p in parts for name in p.ignored}),
            [start + at for p, start in zip(parts, starts, strict=False) for at in p.nonfinite_loss],
        )


def parse(body: bytes) -> Parsed:
    """A raw JSON batch checked and laid out as rows; raises record.RecordError naming every problem
    (locations rooted at the batch: ("intervals", i, ...))."""
    return Parsed.of(decode(body))


def parsed_records(records: Sequence[Mapping[str, Any]]) -> Parsed:
    """Records built in Python (dicts, as the wire carries them), checked as the route checks them."""
    return Parsed.of(convert({"intervals": list(records)}))
