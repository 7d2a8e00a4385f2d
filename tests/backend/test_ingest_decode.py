"""The ingest route's two decoders agree: msgspec's typed decode (schemas.decode_batch, the fast
way) stores exactly what the pydantic path (schemas.parse_batch) stores, and whatever it refuses
goes to the pydantic path, whose 422 names every problem. No database needed."""

import json
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from packscope.backend.ingest.record import decode_batch, parse_batch
from packscope.backend.ingest.rows import Parsed, parse
from tests.backend.conftest import make_record

# (where in a record, a value to put there): types, bounds and shapes the schema refuses or takes.
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


def _same(body: bytes) -> Parsed | None:
    """parse(body) against the pydantic path: the same rows, or the same errors."""
    try:
        expected = Parsed.from_records(*parse_batch(body))
    except ValidationError as refused:
        with pytest.raises(ValidationError) as raised:
            parse(body)
        assert repr(raised.value.errors(include_url=False)) == repr(refused.errors(include_url=False))  # NaN != NaN
        return None
    got = parse(body)
    assert (got.values, got.histograms, got.sites) == (expected.values, expected.histograms, expected.sites)
    return got


def _records(n: int, seed: int) -> list[dict[str, Any]]:
    rng = random.Random(seed)
    out = [make_record(i, rng, rank=i % 2) for i in range(n)]
    out[0]["gpu"] = {"util_pct": 97.0, "power_w": 650.0, "energy_j": 975.0}
    out[-1]["channel_loss"] = {"code": 2.1, "text": 1e301}
    out[-1]["channel_tokens"] = {"code": 18432, "text": 7}
    return out


def test_a_clean_batch_takes_the_fast_way_and_stores_what_the_pydantic_path_stores():
    records = _records(8, seed=3)
    records[2]["loss"] = 1e301  # diverged: stored as missing either way
    body = _body(records)
    assert decode_batch(body) is not None
    got = _same(body)
    assert got is not None and len(got) == 8


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    changes=st.lists(
        st.tuples(st.integers(0, 2), st.sampled_from(PLACES), st.sampled_from(VALUES)), min_size=0, max_size=3
    ),
    seed=st.integers(0, 3),
)
def test_fast_and_pydantic_paths_agree(changes, seed):
    records = _records(3, seed)
    for at, place, value in changes:
        _put(records[at], place, value)
    _same(_body(records))


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
def test_bodies_that_are_not_batches_get_the_pydantic_errors(body):
    assert decode_batch(body) is None
    _same(body)


def test_repeated_keys_and_sites_in_a_batch_are_kept_as_sent():
    records = _records(3, seed=1)
    records[2]["interval"] = records[0]["interval"]  # a repeated key: ingest stores the first
    got = _same(_body(records))
    assert got is not None and got.keys()[0] == got.keys()[2]
