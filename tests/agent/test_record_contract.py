"""What the agent sends is the catalogue's record: every key it sends is a field of the record the
server decodes (none would be ignored), and every field the record needs is there, for each batch
form, with and without the optional readings and for a model with windowed and chunked layers."""

import json

import torch

from packscope.agent import Agent, AgentConfig, ModelSpec
from packscope.backend.ingest.record import decode, unknown_fields
from packscope.core.catalogue import FIELDS

FULL = ModelSpec(layers=2, hidden=64, heads=4, ffn=128, vocab=256)
KINDS = ModelSpec(
    layers=3, hidden=64, heads=4, ffn=128, vocab=256, layer_kinds=("sliding", "chunked", "full"), window=40, chunk=32
)


def _records(model: ModelSpec) -> list[dict]:
    agent = Agent(AgentConfig(log_every=2, count_syncs=False), model=model)
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


def test_every_key_the_agent_sends_is_a_field_of_the_record_and_none_is_missing():
    for model in (FULL, KINDS):
        records = _records(model)
        assert len(records) == 2
        body = json.dumps({"intervals": records}).encode()
        assert unknown_fields(json.loads(body)) == []
        decoded, ignored = decode(body)  # the server's decoder: a missing or mistyped field raises
        assert ignored == [] and len(decoded) == 2
        for record in records:
            for f in FIELDS:
                holder = record
                for key in f.wire_path[:-1]:
                    holder = holder.get(key) or {}
                if f.required and f.default is None:
                    assert f.wire_path[-1] in holder, (model, f.name)


def test_a_model_with_layer_kinds_sends_their_sums():
    (first, _) = _records(KINDS)
    # cu_seqlens [100, 200, 212] then position ids [3, 2, 5]: each kind's documented rule, per document.
    docs = [100, 200, 212, 3, 2, 5]
    assert first["window_sq_sum_thd"] == sum(s * s if s <= 40 else 2 * s * 40 - 40 * 40 for s in docs)
    assert first["chunk_sq_sum_thd"] == sum((s // 32) * 32 * 32 + (s % 32) ** 2 for s in docs)
    assert first["window_sq_sum_bshd"] == (2 * 512 * 40 - 40 * 40) + 10 * 10  # a 512-slot pack, a 10-token row
    assert all(r["window_sq_sum_thd"] == r["chunk_sq_sum_thd"] == 0 for r in _records(FULL))
