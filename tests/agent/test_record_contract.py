"""What the agent sends is the catalogue's record: its keys are the catalogue's wire fields (laid
out by catalogue.wire_record), the server decodes them all (none would be ignored), for each batch
form, with and without the optional readings and for a model with windowed and chunked layers."""

import dataclasses
import json

import pytest
import torch

from packscope.agent import Agent, AgentConfig, ModelSpec
from packscope.backend.ingest.record import decode, unknown_fields
from packscope.core import catalogue
from packscope.core.catalogue import FIELDS
from tests.agent.test_record_snapshot import FakeNvml

FULL = ModelSpec(layers=2, hidden=64, heads=4, ffn=128, vocab=256)
KINDS = ModelSpec(
    layers=3, hidden=64, heads=4, ffn=128, vocab=256, layer_kinds=("sliding", "chunked", "full"), window=40, chunk=32
)


def _records(model: ModelSpec) -> list[dict]:
    agent = Agent(AgentConfig(log_every=2, count_syncs=False), model=model)
    agent.nvml = FakeNvml()  # every reading, then some, then none
    forms = [
        {"cu_seqlens": torch.tensor([0, 100, 300, 512], dtype=torch.int32), "shape": (1, 512)},
        {"position_ids": torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3, 4]])},
        {"attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])},
        {"shape": (2, 64)},
    ]
    for i, form in enumerate(forms):
        agent.step_begin()
        agent.observe_batch(**form)
        channels = torch.tensor([[4.0, 2.0], [0.0, 0.0]], dtype=torch.float64) if i % 2 else None
        agent.step_end(loss=torch.tensor(2.5) if i < 3 else None, lr=1e-3, grad_norm=0.5, channel_loss=channels)
    agent.close()
    return list(agent.records)


# The record's parts that are no scalar field of the catalogue (docs/wire.md).
OTHER_PARTS = {"syncs.sites", "histograms", "channel_loss", "channel_tokens"}
# What only CUPTI's activity trace measures (a CUDA run with sync_backend="cupti": tests/gpu).
TRACED = {
    "traced_steps", "traced_step_time_s", "traced_busy_s", "sync_idle_s", "launch_idle_s", "traced_gaps",
    "sync_idle_between_s", "sync_blocked_s", "sync_blocked_between_s", "sync_loop_idle_s", "sync_loop_blocked_s",
}  # fmt: skip
# What only a model with zero-computation experts sends (tests/agent/test_longcat_flash.py).
ROUTED = {"expert_assignments"}
WIRE_FIELDS = {".".join(f.wire_path) for f in FIELDS} - TRACED - ROUTED


def scalar_paths(value: dict, prefix: str = "") -> set[str]:
    """The dotted paths of a record's scalars and nulls, its OTHER_PARTS left out."""
    paths = set()
    for key, inner in value.items():
        path = prefix + key
        if path in OTHER_PARTS:
            continue
        paths |= scalar_paths(inner, path + ".") if isinstance(inner, dict) else {path}
    return paths


def test_the_records_keys_are_the_catalogues_wire_fields_and_the_server_takes_them():
    for model in (FULL, KINDS):
        first, second = _records(model)
        assert scalar_paths(first) == WIRE_FIELDS  # every NVML reading given
        assert scalar_paths(second) == WIRE_FIELDS - {"gpu.energy_j"}  # an optional reading left out
        body = json.dumps({"intervals": [first, second]}).encode()
        assert unknown_fields(json.loads(body)) == []
        checked = decode(body)  # the server's decoder: a missing or mistyped field raises
        assert checked.ignored == [] and len(checked.records) == 2 and checked.nonfinite_loss == ()


def test_a_field_moved_in_the_catalogue_moves_in_the_record(monkeypatch):
    """The record's layout is the catalogue's: a field given another wire path is sent there."""
    moved = [dataclasses.replace(f, wire="timing.lag_steps") if f.name == "timing_lag_steps" else f for f in FIELDS]
    monkeypatch.setattr(catalogue, "FIELDS", tuple(moved))
    record = _records(FULL)[0]
    assert "timing_lag_steps" not in record and record["timing"]["lag_steps"] >= 0


def test_a_catalogue_field_the_agent_does_not_measure_is_named():
    """Adding a field is a catalogue entry plus the agent's measurement: without the measurement
    the record is not built, and the error names the field."""
    extra = catalogue.Field("new_count", "int", "", "a field the agent does not measure")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(catalogue, "FIELDS", (*FIELDS, extra))
        with pytest.raises(ValueError, match="new_count"):
            _records(FULL)


def test_a_model_with_layer_kinds_sends_their_sums():
    (first, _) = _records(KINDS)
    # cu_seqlens [100, 200, 212] then position ids [3, 2, 5]: each kind's documented rule, per document.
    docs = [100, 200, 212, 3, 2, 5]
    assert first["window_sq_sum_thd"] == sum(s * s if s <= 40 else 2 * s * 40 - 40 * 40 for s in docs)
    assert first["chunk_sq_sum_thd"] == sum((s // 32) * 32 * 32 + (s % 32) ** 2 for s in docs)
    assert first["window_sq_sum_bshd"] == (2 * 512 * 40 - 40 * 40) + 10 * 10  # a 512-slot pack, a 10-token row
    assert all(r["window_sq_sum_thd"] == r["chunk_sq_sum_thd"] == 0 for r in _records(FULL))


def test_a_vision_language_model_sends_its_towers_sums_beside_the_text():
    """Qwen2.5-VL-7B's published config: images given as image_grid_thw beside the text form; the
    record's vision sums are the reference's for those grids and its FLOPs add the tower's work
    (the same in every view); a text model refuses images with a message."""
    from pathlib import Path

    from packscope.core.hf_config import read_hf_config
    from packscope.core.vision import batch_sums

    model = read_hf_config(Path(__file__).parents[1] / "fixtures" / "hf" / "published" / "qwen2_5_vl_7b.json")
    assert model.vision is not None
    grids = [[(1, 36, 52), (2, 28, 28)], [(1, 112, 84)]]
    agent = Agent(AgentConfig(log_every=2, count_syncs=False), model=model)
    for step_grids in grids:
        agent.step_begin()
        agent.observe_batch(
            cu_seqlens=torch.tensor([0, 700, 2048], dtype=torch.int32),
            shape=(1, 2048),
            image_grid_thw=torch.tensor(step_grids),
        )
        agent.step_end(loss=torch.tensor(1.0))
    agent.close()
    (record,) = agent.records
    want = batch_sums(model.vision, [g for step in grids for g in step])
    assert {name: record[name] for name in want} == want and want["vision_window_sq_sum"] > 0
    text = model.triad_by_kind(
        record["tokens"], record["real_tokens"], {k: record[k] for k in record if "_sq_sum_" in k}
    )
    tower = model.vision.flops(want)
    assert record["flops_thd"] == float(text["thd"] + tower) and record["flops_bshd"] == float(text["bshd"] + tower)
    checked = decode(json.dumps({"intervals": [record]}).encode())
    assert checked.ignored == [] and len(checked.records) == 1

    text_only = Agent(AgentConfig(log_every=2, count_syncs=False), model=FULL)
    text_only.step_begin()
    with pytest.raises(ValueError, match="no vision tower"):
        text_only.observe_batch(shape=(1, 8), image_grid_thw=torch.tensor([(1, 4, 4)]))


def test_the_hf_callback_reads_a_vlm_batchs_images():
    """The callback's forward hook sees the model's kwargs: a Qwen2.5-VL batch's image_grid_thw
    goes to observe_batch beside the text form, counted like the agent's own call."""
    from pathlib import Path

    from packscope.agent.integrations.batches import image_kwargs, observe_kwargs
    from packscope.core.hf_config import read_hf_config

    model = read_hf_config(Path(__file__).parents[1] / "fixtures" / "hf" / "published" / "qwen2_5_vl_7b.json")
    batch = {
        "input_ids": torch.zeros(1, 64, dtype=torch.long),
        "attention_mask": torch.ones(1, 64, dtype=torch.long),
        "pixel_values": torch.zeros(4 * 16, 1176),
        "image_grid_thw": torch.tensor([[1, 4, 16]]),
    }
    kwargs = {**observe_kwargs(batch), **image_kwargs(batch, model.vision)}
    assert set(image_kwargs(batch, model.vision)) == {"image_grid_thw"}  # Qwen's tower reads its grids
    assert image_kwargs(batch, FULL.vision) == {}
    agent = Agent(AgentConfig(log_every=1, count_syncs=False), model=model)
    agent.step_begin()
    agent.observe_batch(**kwargs)
    agent.step_end()
    agent.close()
    (record,) = agent.records
    assert record["vision_patches"] == 64 and record["vision_images"] == 1
