"""What the HF callback records for a batch with and without an audio tower's clips."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from packscope.core.flops import ModelSpec


def records_with_and_without_clips(
    model: ModelSpec, clips: dict[str, Any], caplog: pytest.LogCaptureFixture
) -> list[dict[str, Any]]:
    """The FLOPs, token and vision fields of one step's record with `clips` in its two micro-batches,
    then without; each time exactly one "audio tower" warning where the batch held clips, none else."""
    from packscope.agent import Agent, AgentConfig
    from packscope.agent.integrations.hf import PackscopeCallback

    records = []
    for with_clips in (True, False):
        batch = {"input_ids": torch.zeros(1, 16, dtype=torch.long), **(clips if with_clips else {})}
        callback = PackscopeCallback(check_cross_documents=False)
        agent = Agent(AgentConfig(log_every=1, count_syncs=False), model=model)
        caplog.clear()
        with caplog.at_level("WARNING", logger="packscope.agent"):
            agent.step_begin()
            callback._observe_batch(agent, (), batch)
            callback._observe_batch(agent, (), batch)
            agent.step_end()
            agent.close()
        warned = [r for r in caplog.records if "audio tower" in r.getMessage()]
        assert len(warned) == (1 if with_clips else 0)
        (record,) = agent.records
        records.append({k: v for k, v in record.items() if k.startswith(("flops_", "tokens", "vision_"))})
    return records
