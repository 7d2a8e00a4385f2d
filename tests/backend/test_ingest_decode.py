"""The ingest route's decoder (ingest/record.py) against a reference written here from the wire
contract (docs/wire.md) with plain Python: on generated batches it stores exactly the values the
reference reads from the JSON, or refuses a batch the reference refuses, naming a record the
reference finds wrong. No database needed."""

import copy
import json
import math
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from packscope.backend.ingest.record import RecordError, unknown_fields
from packscope.backend.ingest.rows import parse
from packscope.core.catalogue import FIELDS, INT64_MAX
from tests.backend.conftest import make_record

# (where in a record, a value to put there): types, bounds and shapes the record refuses or takes.
PLACES = [
    ("interval",),
    ("rank",),
    ("first_step",),
    ("steps",),
    ("tokens",),
    ("real_tokens",),
    ("wall_end",),
    ("gpu_time_s",),
    ("loss",),
    ("grad_norm",),
    ("gpu",),
    ("gpu", "util_pct"),
    ("gpu", "power_w"),
    ("syncs", "total"),
    ("syncs", "sites", 0, "site"),
    ("syncs", "sites", 1, "count"),
    ("histograms", "documents", "count", 3),
    ("histograms", "packs", "tokens"),
    ("channel_loss",),
    ("channel_tokens",),
    ("unknown_field",),
    ("syncs", "per_iteration"),
]
VALUES = [
    None,
    0,
    -1,
    1,
    7.0,
    7.5,
    True,
    "5",
    "a\x00b",
    "\ud800",
    "é",
    2**31,
    2**63,
    2**70,
    1e299,
    1e301,
    -1e301,
    5e-324,
    float("nan"),
    float("inf"),
    [],
    [0] * 24,
    [1] * 23,
    {},
    {"code": 2.5},
    {"code": 1e301},
    {"code": 3},
    {"util_pct": 50.0},
    {"util_pct": 150.0},
]


# -- the reference ----------------------------------------------------------------------------------
class Refused(Exception):
    pass


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _storable(s: Any) -> bool:
    if not isinstance(s, str) or "\x00" in s:
        return False
    try:
        s.encode()
    except UnicodeEncodeError:
        return False
    return True


def _diverged(v: float) -> bool:
    return not abs(v) <= 1e300  # NaN, inf, beyond any reading


def reference_row(r: Any) -> tuple[Any, ...]:
    """The values the contract says a record stores, in catalogue order, plus the channels; Refused
    where the contract refuses it."""
    if not isinstance(r, dict):
        raise Refused
    out = []
    for f in FIELDS:
        holder: Any = r
        for key in f.wire_path[:-1]:
            holder = holder.get(key) if isinstance(holder, dict) else None
            if holder is None and not f.required:
                break
            if not isinstance(holder, dict):
                raise Refused
        value = holder.get(f.wire_path[-1]) if isinstance(holder, dict) else None
        lower = f.minimum if f.minimum is not None else -f.upper
        if value is None and f.default is not None and f.wire_path[-1] not in holder:
            value = f.default  # a field added later: absent reads as its default
        if value is None:
            if f.required:
                raise Refused
        elif f.kind == "int":
            if not _is_int(value) or not lower <= value <= f.upper:
                raise Refused
        elif not _is_number(value):
            raise Refused
        elif not f.required and _diverged(value):
            value = None
        elif not lower <= value <= f.upper or (value != 0 and abs(value) < 1e-300):
            raise Refused
        out.append(float(value) if f.kind == "float" and value is not None else value)
    row = dict(zip((f.name for f in FIELDS), out, strict=True))
    if row["first_step"] > row["last_step"] or row["steps"] > row["last_step"] - row["first_step"] + 1:
        raise Refused
    if row["real_tokens"] > row["tokens"] or row["wall_end"] < row["wall_start"]:
        raise Refused
    if row["syncs_uncounted_steps"] > row["steps"]:  # more steps left uncounted than the interval has
        raise Refused
    syncs = r["syncs"]
    sites = syncs.get("sites", [])
    if not isinstance(sites, list) or len(sites) > 100:
        raise Refused
    for s in sites:
        if not (isinstance(s, dict) and _storable(s.get("site")) and 1 <= len(s["site"]) <= 500):
            raise Refused
        if not (_is_int(s.get("count")) and 0 <= s["count"] <= INT64_MAX):
            raise Refused
    if len({s["site"] for s in sites}) != len(sites):
        raise Refused
    hist = r.get("histograms")
    for kind in ("documents", "packs"):
        for part in ("count", "tokens"):
            counts = (
                hist.get(kind, {}).get(part) if isinstance(hist, dict) and isinstance(hist.get(kind), dict) else None
            )
            if not (isinstance(counts, list) and len(counts) == 24):
                raise Refused
            if not all(_is_int(c) and 0 <= c <= INT64_MAX for c in counts):
                raise Refused
    channels = []
    for part in ("channel_loss", "channel_tokens"):
        value = r.get(part)
        if value is not None:
            if not isinstance(value, dict) or not all(_storable(k) and len(k) <= 100 for k in value):
                raise Refused
            for v in value.values():
                if part == "channel_tokens" and not (_is_int(v) and 0 <= v <= INT64_MAX):
                    raise Refused
                if part == "channel_loss" and v is not None and not _is_number(v):
                    raise Refused
            if part == "channel_loss":
                value = {k: None if v is None or _diverged(v) else float(v) for k, v in value.items()}
            value = json.dumps(value, sort_keys=True)
        channels.append(value)
    return (*out, *channels)


def _holds(holder: Any, key: Any) -> bool:
    """Whether `holder[key]` exists (an earlier change may have put a list where a dict was)."""
    if isinstance(holder, dict):
        return key in holder
    return isinstance(holder, list) and isinstance(key, int) and key < len(holder)


def _put(record: dict[str, Any], place: tuple[Any, ...], value: Any) -> None:
    holder: Any = record
    for key in place[:-1]:
        if not _holds(holder, key):
            return
        holder = holder[key]
    if isinstance(holder, dict) or _holds(holder, place[-1]):
        holder[place[-1]] = value


def _body(records: list[dict[str, Any]]) -> bytes:
    # ensure_ascii keeps lone surrogates as escapes; Python writes NaN and Infinity, as agents do.
    return json.dumps({"intervals": records}).encode()


def _records(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = [make_record(i, rng, rank=i % 2) for i in range(n)]
    out[0]["gpu"] = {"util_pct": 97.0, "power_w": 650.0, "energy_j": 975.0}
    out[-1]["channel_loss"] = {"code": 2.1, "text": 1e301}
    out[-1]["channel_tokens"] = {"code": 18432, "text": 7}
    return out


def _same_text(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    return len(a) == len(b) and all(
        x == y or (isinstance(x, float) and isinstance(y, float) and math.isnan(x) and math.isnan(y))
        for x, y in zip(a, b, strict=True)
    )


def _agree(records: list[dict[str, Any]]) -> None:
    body = _body(records)
    want: list[tuple[Any, ...]] | None
    wrong: set[int] = set()
    rows = []
    for i, r in enumerate(records):
        try:
            rows.append(reference_row(r))
        except (Refused, KeyError, TypeError, AttributeError):
            wrong.add(i)
    want = None if wrong else rows
    if want is None:
        with pytest.raises(RecordError) as raised:
            parse(body)
        named = {loc[1] for loc, _, _ in raised.value.problems if len(loc) > 1 and loc[0] == "intervals"}
        assert named & wrong, (raised.value.problems, wrong)
        return
    got = parse(body)
    assert [_same_text(g, w) for g, w in zip(got.values, want, strict=True)] == [True] * len(want)
    assert got.ignored == unknown_fields(json.loads(body))


def test_a_clean_batch_stores_what_the_contract_says():
    records = _records(8, seed=3)
    records[2]["loss"] = 1e301  # diverged: stored as missing
    _agree(records)
    got = parse(_body(records))
    assert len(got) == 8 and got.values[2][[f.name for f in FIELDS].index("loss")] is None and got.ignored == []


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    changes=st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from(PLACES), st.sampled_from(VALUES)), min_size=0, max_size=3
    ),
    seed=st.integers(0, 3),
)
def test_the_decoder_agrees_with_the_reference(changes, seed):
    records = _records(3, seed)
    for at, place, value in changes:
        _put(records[at], place, copy.deepcopy(value))  # a shared dict put inside itself would be a cycle
    _agree(records)


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"[]",
        b'{"intervals": []}',
        b'{"intervals": {}}',
        b'{"intervals": [1]}',
        b"\xff",
        b'{"intervals": [' + b"{}," * 2 + b"{}]}",
    ],
)
def test_bodies_that_are_not_batches_are_refused_with_a_reason(body):
    with pytest.raises(RecordError) as raised:
        parse(body)
    assert all(message for _, message, _ in raised.value.problems)


def test_fields_the_record_does_not_know_are_named():
    records = _records(2, seed=1)
    records[0]["tokenz"] = 5
    records[1]["gpu"] = {"util_pct": 50.0, "temperature_c": 71.0}
    records[1]["syncs"]["per_iteration"] = 0.5
    got = parse(_body(records))
    assert got.ignored == ["gpu.temperature_c", "syncs.per_iteration", "tokenz"] and len(got) == 2


def test_repeated_keys_and_sites_in_a_batch_are_kept_as_sent():
    records = _records(3, seed=1)
    records[2]["interval"] = records[0]["interval"]  # a repeated key: ingest stores the first
    got = parse(_body(records))
    assert got.keys()[0] == got.keys()[2]


@pytest.mark.parametrize("ignored", ["a\x00b", "\ud800"])
def test_a_lone_surrogate_is_named_where_the_record_reads_it(ignored):
    """A body with a lone surrogate is read by `json`; when the records then cannot be converted,
    the 422 names the string UTF-8 cannot encode in a field the record reads, not an earlier one
    that merely holds a NUL byte or sits in a field it ignores (hypothesis found both naming
    record 0's unknown field for record 1's interval)."""
    records = _records(2, seed=1)
    records[0]["unknown_field"] = ignored
    records[1]["interval"] = "\ud800"
    with pytest.raises(RecordError) as raised:
        parse(_body(records))
    assert [loc for loc, _, _ in raised.value.problems] == [("intervals", 1, "interval")]
    _agree(records)


# Every way JSON can write a magnitude below 1e-300 (the usual batch's floats are not looked at one
# by one: its text is screened for these forms, record.py's _no_tiny_numbers), and numbers that
# look alike but are fine (they only cost the full check).
TINY_TEXTS = [
    "5e-324",
    "1E-301",
    "1e-0000000310",
    "0.0000000001e-295",
    "0." + "0" * 205 + "1e-99",
    "0." + "0" * 310 + "1",
]
FINE_TEXTS = ["0", "0.0", "1e-300", "2.5e-7", "1e-99", "0.000001", "1e+300", "-123.5", "-1e-300", "0." + "0" * 250]
_AT_LOSS = [f.name for f in FIELDS].index("loss")


def _with_loss_text(text: str) -> bytes:
    rng = random.Random(2)
    records = [make_record(i, rng) for i in range(3)]  # nothing else that takes the full check
    records[1]["loss"] = 12345.678
    return _body(records).replace(b"12345.678", text.encode(), 1)


@pytest.mark.parametrize("text", TINY_TEXTS)
def test_a_number_too_small_to_store_is_refused_however_it_is_written(text):
    with pytest.raises(RecordError) as raised:
        parse(_with_loss_text(text))
    ((loc, message, _),) = raised.value.problems
    assert loc == ("intervals", 1, "loss") and "too small to store" in message


@pytest.mark.parametrize("text", FINE_TEXTS)
def test_numbers_that_only_look_small_are_stored(text):
    assert parse(_with_loss_text(text)).values[1][_AT_LOSS] == float(text)
