"""An omni run end to end: the agent's records with audio sums, stored by the server, whose totals
re-derive the same FLOPs from the sums and the model dict's audio tower (migration 0024's columns)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from tests.agent.test_audio_sums import GEMMA4, OMNI, _model, mask  # noqa: E402


@pytest.mark.parametrize("tower", ["qwen3_omni", "gemma4"])
def test_the_servers_totals_add_the_audio_tower_as_the_agent_does(make_client, database_url, new_run, tower):
    from packscope.agent import Agent, AgentConfig

    audio = OMNI[800] if tower == "qwen3_omni" else GEMMA4[(4, 3, 2)]
    key = "feature_attention_mask" if tower == "qwen3_omni" else "input_features_mask"
    model = _model(audio)
    agent = Agent(AgentConfig(log_every=1, count_syncs=False), model=model)
    for clips in ([[250, 70], [1650, 90, 30]], [[401]]):
        agent.step_begin()
        for call in clips:
            agent.observe_batch(shape=(1, 16), **{key: mask(call)})
        agent.step_end()
    agent.close()
    records = list(agent.records)
    assert len(records) == 2 and all(r["audio_clips"] > 0 for r in records)

    client = make_client(database_url)
    assert client.post("/api/v1/runs", json=new_run(model=model.to_dict())).status_code == 201
    assert client.post("/api/v1/runs/run-1/intervals", json={"intervals": records}).json()["accepted"] == 2
    totals = client.get("/api/v1/runs/run-1").json()["totals"]
    tower_flops = sum(audio.flops({name: r[name] for name in audio.c_by_sum}) for r in records)
    for view in ("bshd", "thd", "useful"):
        assert totals[f"flops_{view}"] == pytest.approx(sum(r[f"flops_{view}"] for r in records), rel=1e-12)
    assert totals["audio_share_pct"] == pytest.approx(100 * tower_flops / totals["flops_thd"], rel=1e-12)
    assert 0 < totals["audio_share_pct"] < 100
