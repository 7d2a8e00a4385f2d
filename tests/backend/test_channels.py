"""Per-channel loss kept at ingest (channel_rollups): each series point's channel loss must equal
Σ mean·tokens / Σ tokens over the raw records it covers, computed here by brute force; records
without channel_tokens (older agents), missing means and zero token counts weigh nothing."""

import random
from typing import Any

import pytest
from sqlalchemy import func, select

from packscope.backend.store.models import CHANNEL_LEVELS, channel_rollups

RUNS = "/api/v1/runs"
CHANNELS = ("code", "math", "web")


def with_channels(recs: list[dict[str, Any]], rng: random.Random) -> list[dict[str, Any]]:
    """Adds channel_loss / channel_tokens to records the way agents send them: most with both,
    some without channel_tokens (an old agent), some with a diverged (null) mean or 0 tokens."""
    for r in recs:
        channels = rng.sample(CHANNELS, rng.randint(1, len(CHANNELS)))
        r["channel_loss"] = {c: rng.uniform(1.0, 4.0) for c in channels}
        r["channel_tokens"] = {c: rng.randint(1, r["real_tokens"]) for c in channels}
        kind = rng.random()
        if kind < 0.15:
            del r["channel_tokens"]
        elif kind < 0.25:
            r["channel_loss"][channels[0]] = None
        elif kind < 0.3:
            r["channel_tokens"][channels[0]] = 0
    return recs


def brute_force(rows: list[dict[str, Any]]) -> tuple[dict[str, float], dict[str, int]]:
    """Per channel: token-weighted mean loss and tokens over rows that carry both numbers."""
    loss_sum: dict[str, float] = {}
    tokens: dict[str, int] = {}
    for r in rows:
        for channel, n in (r.get("channel_tokens") or {}).items():
            mean = r["channel_loss"].get(channel)
            if mean is None or n == 0:
                continue
            loss_sum[channel] = loss_sum.get(channel, 0.0) + mean * n
            tokens[channel] = tokens.get(channel, 0) + n
    return {c: loss_sum[c] / tokens[c] for c in tokens}, tokens


def post_all(client, run_id, recs, rng):
    at = 0
    while at < len(recs):
        size = rng.randint(1, 50)
        response = client.post(f"{RUNS}/{run_id}/intervals", json={"intervals": recs[at : at + size]})
        assert response.status_code == 200, response.text
        at += size


def check(client, run_id, recs, max_points, step_min=None, step_max=None):
    params = {"max_points": max_points}
    params.update({k: v for k, v in (("step_min", step_min), ("step_max", step_max)) if v is not None})
    answer = client.get(f"{RUNS}/{run_id}/series", params=params).json()
    cols = answer["columns"]
    in_range = [
        r
        for r in recs
        if (step_min is None or r["last_step"] >= step_min) and (step_max is None or r["first_step"] <= step_max)
    ]
    _, everywhere = brute_force(in_range)
    assert sorted(answer["channel_loss"]) == sorted(everywhere)  # every channel with tokens in range
    for i, (first, last) in enumerate(zip(cols["first_step"], cols["last_step"], strict=True)):
        bucket = [r for r in in_range if first <= r["first_step"] and r["last_step"] <= last]
        want_loss, want_tokens = brute_force(bucket)
        for channel in everywhere:
            got = answer["channel_loss"][channel][i]
            if channel in want_loss:
                assert got == pytest.approx(want_loss[channel], rel=1e-12), (i, channel)
                assert answer["channel_tokens"][channel][i] == want_tokens[channel]
            else:
                assert got is None and answer["channel_tokens"][channel][i] == 0, (i, channel)


@pytest.fixture
def any_client(database_url, make_client):
    return make_client(database_url)


@pytest.mark.parametrize("ranks", [1, 3])
def test_channel_loss_equals_brute_force(any_client, new_run, records, ranks):
    rng = random.Random(ranks)
    assert any_client.post(RUNS, json=new_run("channels")).status_code == 201
    recs = [r for rank in range(ranks) for r in records(170, start=5, seed=rank, rank=rank, gpus=2)]
    with_channels(recs, rng)
    rng.shuffle(recs)  # ranks and intervals arrive interleaved
    post_all(any_client, "channels", recs, rng)
    for max_points, step_min, step_max in [
        (500, None, None),
        (1, None, None),
        (7, None, None),
        (33, 300, 1333),
        (4, 777, None),
        (10, None, 95),
    ]:
        check(any_client, "channels", recs, max_points, step_min, step_max)


def test_old_agents_add_nothing(any_client, new_run, records):
    """Means without token counts are not guessed at: no channel rollups, no channel series."""
    assert any_client.post(RUNS, json=new_run("old")).status_code == 201
    recs = records(20)
    for r in recs:
        r["channel_loss"] = {"code": 2.0}
    post_all(any_client, "old", recs, random.Random(0))
    with any_client.app.state.engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(channel_rollups)).scalar_one() == 0
    answer = any_client.get(f"{RUNS}/old/series").json()
    assert answer["points"] == 20 and answer["channel_loss"] == {} and answer["channel_tokens"] == {}


def test_every_level_holds_every_token_once(any_client, new_run, records):
    assert any_client.post(RUNS, json=new_run("levels")).status_code == 201
    recs = with_channels(records(90, seed=4), random.Random(4))
    post_all(any_client, "levels", recs, random.Random(5))
    post_all(any_client, "levels", recs, random.Random(6))  # a replay changes nothing
    _, tokens = brute_force(recs)
    with any_client.app.state.engine.connect() as connection:
        query = select(channel_rollups.c.level, channel_rollups.c.channel, func.sum(channel_rollups.c.tokens)).group_by(
            channel_rollups.c.level, channel_rollups.c.channel
        )
        stored = {(level, channel): n for level, channel, n in connection.execute(query)}
    assert stored == {(level, c): tokens[c] for level in CHANNEL_LEVELS for c in tokens}  # level 0: the intervals


def test_deleting_a_run_deletes_its_channel_rollups(any_client, new_run, records):
    assert any_client.post(RUNS, json=new_run("gone")).status_code == 201
    post_all(any_client, "gone", with_channels(records(10), random.Random(1)), random.Random(1))
    assert any_client.delete(f"{RUNS}/gone").status_code == 204
    with any_client.app.state.engine.connect() as connection:
        assert connection.execute(select(func.count()).select_from(channel_rollups)).scalar_one() == 0


def test_ingest_hands_the_channel_rollups_decoded_channels(any_client, new_run, records, monkeypatch):
    """The rows hold channel_loss/channel_tokens as JSON text (as stored); ingest hands the
    channel rollups the decoded dicts it already has instead of text to parse back, with the
    same sums to the last bit."""
    import json

    from packscope.backend.ingest.rows import parse, row_key
    from packscope.backend.store import aggregates

    recs = with_channels(records(60, seed=7), random.Random(7))
    parsed = parse(json.dumps({"intervals": recs}).encode())
    rows = [(1, *values) for values in parsed.values]
    from_text = aggregates._channel_blocks(1, rows, None)
    assert from_text  # the batch has channels with tokens
    assert [row_key(row) for row in rows] == parsed.keys()
    assert aggregates._channel_blocks(1, rows, parsed.channels) == from_text

    handed: list[type] = []
    as_dict = aggregates._as_dict

    def recording(value):
        handed.append(type(value))
        return as_dict(value)

    monkeypatch.setattr(aggregates, "_as_dict", recording)
    assert any_client.post(RUNS, json=new_run("decoded")).status_code == 201
    post_all(any_client, "decoded", recs, random.Random(8))
    assert handed and str not in handed
