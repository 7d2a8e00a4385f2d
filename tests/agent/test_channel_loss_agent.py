"""Per-channel loss through the agent: the interval's means equal a brute force over its steps,
they ride in the boundary's one copy, and an ordinary step reads nothing from the device."""

from __future__ import annotations

import pytest
import torch

from packscope.agent import Agent, AgentConfig, ModelSpec

MODEL = ModelSpec(layers=2, hidden=64, heads=4, kv_heads=4, ffn=128, vocab=100)
NAMES = ("code", "math", "chat", "web")


def _step_sums(g: torch.Generator) -> torch.Tensor:
    counts = torch.randint(0, 50, (len(NAMES),), generator=g).double()
    counts[1] = 0  # one channel without tokens in any step: absent from the record
    return torch.stack([counts * 3 * torch.rand(len(NAMES), generator=g, dtype=torch.float64), counts], dim=1)


def _run(agent: Agent, steps: list[torch.Tensor]) -> None:
    for sums in steps:
        agent.step_begin()
        agent.observe_batch(shape=(2, 64))
        agent.step_end(loss=torch.tensor(1.0), channel_loss=sums, channel_names=NAMES)


def test_interval_channel_loss_equals_brute_force():
    g = torch.Generator().manual_seed(0)
    steps = [_step_sums(g) for _ in range(10)]
    agent = Agent(AgentConfig(log_every=4, count_syncs=False), model=MODEL)
    _run(agent, steps)
    agent.close()
    records = list(agent.records)
    assert [r["steps"] for r in records] == [4, 4, 2]
    for record, first in zip(records, (0, 4, 8), strict=True):
        interval = torch.stack(steps[first : first + record["steps"]]).sum(0)
        want = {name: float(interval[c, 0] / interval[c, 1]) for c, name in enumerate(NAMES) if interval[c, 1]}
        assert record["channel_loss"].keys() == want.keys() and "math" not in want
        for name, value in want.items():
            assert record["channel_loss"][name] == pytest.approx(value, rel=1e-12)
        tokens = {name: int(interval[c, 1]) for c, name in enumerate(NAMES) if interval[c, 1]}
        assert record["channel_tokens"] == tokens


def test_no_channel_loss_no_field():
    agent = Agent(AgentConfig(log_every=2, count_syncs=False), model=MODEL)
    for _ in range(2):
        agent.step_begin()
        agent.observe_batch(shape=(2, 64))
        agent.step_end(loss=torch.tensor(1.0))
    agent.close()
    assert "channel_loss" not in agent.records[0] and "channel_tokens" not in agent.records[0]


def test_an_ordinary_step_reads_no_value(monkeypatch):
    g = torch.Generator().manual_seed(1)
    agent = Agent(AgentConfig(log_every=5, count_syncs=False), model=MODEL)
    reads = []
    for name in ("item", "tolist", "__bool__", "__float__", "__int__", "__index__"):
        original = getattr(torch.Tensor, name)
        monkeypatch.setattr(
            torch.Tensor, name, lambda t, *a, _o=original, _n=name, **k: reads.append(_n) or _o(t, *a, **k)
        )
    _run(agent, [_step_sums(g) for _ in range(4)])  # steps 1-4 of a 5-step interval
    assert reads == []
    monkeypatch.undo()
    agent.close()


def test_channel_loss_must_be_sums_and_counts():
    agent = Agent(AgentConfig(log_every=2, count_syncs=False), model=MODEL)
    agent.step_begin()
    with pytest.raises(ValueError, match="channels, 2"):
        agent.step_end(channel_loss=torch.zeros(4))
    agent.step_begin()
    with pytest.raises(ValueError, match="names"):
        agent.step_end(channel_loss=torch.zeros(3, 2), channel_names=NAMES)
