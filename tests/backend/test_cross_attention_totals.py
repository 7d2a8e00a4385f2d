"""An mllama run end to end: the HF callback's records with the tower's and the cross-attention
layers' sums, stored by the server, whose totals re-derive the same FLOPs from the sums and the
model dict's vision tower (migration 0025's columns)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from tests.agent.test_mllama import CONFIG, callback_record, image_inputs  # noqa: E402


def test_the_servers_totals_add_the_cross_attention_layers_as_the_agent_does(make_client, database_url, new_run):
    from packscope.agent.hf_structure import spec_from_structure

    model = spec_from_structure(CONFIG)
    assert model.vision is not None
    with_images = image_inputs()
    records = [
        callback_record(model, [with_images, {"input_ids": with_images["input_ids"]}]),
        callback_record(model, [{"input_ids": with_images["input_ids"]}]),  # no images: the layers skipped
    ]
    records[1]["interval"] = 1
    assert records[0]["cross_pairs"] > 0 and records[1]["cross_pairs"] == records[1]["cross_text_tokens"] == 0

    client = make_client(database_url)
    assert client.post("/api/v1/runs", json=new_run(model=model.to_dict())).status_code == 201
    assert client.post("/api/v1/runs/run-1/intervals", json={"intervals": records}).json()["accepted"] == 2
    totals = client.get("/api/v1/runs/run-1").json()["totals"]
    tower_flops = sum(model.vision.flops({name: r[name] for name in model.vision.c_by_sum}) for r in records)
    for view in ("bshd", "thd", "useful"):
        assert totals[f"flops_{view}"] == pytest.approx(sum(r[f"flops_{view}"] for r in records), rel=1e-12)
    assert totals["vision_share_pct"] == pytest.approx(100 * tower_flops / totals["flops_thd"], rel=1e-12)
    assert 0 < totals["vision_share_pct"] < 100
