"""The agent's wire records for fixed inputs, against a snapshot (record_snapshot.jsonl): every
value and its JSON type the same as when the snapshot was taken. Fixed inputs: a stepping fake
clock for the host and step times, fake NVML readings, sync sites recorded by hand, and every
batch form, with a windowed and chunked model and a vision-language one.

Regenerate (only for an intended change of the record): PACKSCOPE_WRITE_SNAPSHOT=1 pytest this file.
"""

import json
import os
import types
from pathlib import Path

import pytest
import torch

from packscope.agent import Agent, AgentConfig, ModelSpec
from packscope.core.hf_config import read_hf_config

SNAPSHOT = Path(__file__).with_name("record_snapshot.jsonl")
KINDS = ModelSpec(
    layers=3, hidden=64, heads=4, ffn=128, vocab=256, layer_kinds=("sliding", "chunked", "full"), window=40, chunk=32
)
VLM = Path(__file__).parents[1] / "fixtures" / "hf" / "published" / "qwen2_5_vl_7b.json"


class SteppingClock:
    """time.time and time.perf_counter that advance by a binary-exact step on every read."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def read(self) -> float:
        self.now += 0.125
        return self.now


class FakeNvml:
    """NvmlSampler's take(): readings with the energy counter, without it, and none at all."""

    def __init__(self) -> None:
        self.readings = [
            {
                "gpu_util_pct": 87.5,
                "gpu_power_w": 412.25,
                "gpu_sm_clock_mhz": 1980.0,
                "gpu_mem_used_bytes": 7.5e10,
                "gpu_energy_j": 812.5,
            },
            {"gpu_util_pct": 50.0, "gpu_power_w": 300.5, "gpu_sm_clock_mhz": 1755.0, "gpu_mem_used_bytes": 6.25e10},
            None,
        ]

    def take(self):
        return self.readings.pop(0) if self.readings else None

    def close(self) -> None:
        pass


@pytest.fixture
def clock(monkeypatch):
    fake = SteppingClock()
    fake_time = types.SimpleNamespace(time=fake.read, perf_counter=fake.read)
    monkeypatch.setattr("packscope.agent.agent.time", fake_time)
    monkeypatch.setattr("packscope.agent.timing.time", fake_time)
    return fake


def _agent(model: ModelSpec, **config) -> Agent:
    return Agent(AgentConfig(run_id="snapshot", log_every=2, **config), model=model)


def _kinds_records() -> list[dict]:
    """Four intervals of a windowed and chunked model: every batch form, optional readings given
    and missing, sync counting on, then sampled out (count_syncs_every), then a refused interval."""
    agent = _agent(KINDS, count_syncs=True, count_syncs_every=3)
    agent.nvml = FakeNvml()
    forms = [
        {"cu_seqlens": torch.tensor([0, 100, 300, 512], dtype=torch.int32), "shape": (1, 512)},
        {"position_ids": torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3, 4]])},
        {"attention_mask": torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])},
        {"shape": (2, 64)},
        {
            "cu_seqlens": torch.tensor([0, 30, 70, 128], dtype=torch.int32),
            "shape": (2, 64),
            "token_mask": torch.tensor([True] * 120 + [False] * 8),
        },
        {"position_ids": [[0, 1, 2, 3, 0, 1, 2, 0]], "attention_mask": [[1, 1, 1, 1, 1, 1, 1, 0]]},
        {"cu_seqlens": torch.tensor([0, 50, 20, 64], dtype=torch.int32), "shape": (1, 64)},  # decreasing: refused
        {"shape": (1, 64)},
    ]
    for i, form in enumerate(forms):
        agent.step_begin()
        agent.observe_batch(**form)
        for _ in range(i % 3):
            agent.syncs.record(f"train.py:{40 + i} in step")
        channels = torch.tensor([[4.5, 2.0], [0.0, 0.0], [1.5, 3.0]], dtype=torch.float64) if i % 2 else None
        agent.step_end(
            loss=torch.tensor(2.5 - 0.25 * i) if i < 5 else None,
            lr=1e-3 if i < 6 else None,
            grad_norm=0.5 * (i + 1) if i != 3 else None,
            channel_loss=channels,
            channel_names=("code", "web", "math") if channels is not None else None,
        )
    agent.close()
    return list(agent.records)


def _vision_records() -> list[dict]:
    """One interval of Qwen2.5-VL: images beside the text, the tower's sums and FLOPs in the record."""
    agent = _agent(read_hf_config(VLM), count_syncs=False)
    for grids in ([(1, 36, 52), (2, 28, 28)], [(1, 112, 84)]):
        agent.step_begin()
        agent.observe_batch(
            cu_seqlens=torch.tensor([0, 700, 2048], dtype=torch.int32),
            shape=(1, 2048),
            image_grid_thw=torch.tensor(grids),
        )
        agent.step_end(loss=torch.tensor(1.0))
    agent.close()
    return list(agent.records)


def _canonical(record: dict) -> str:
    """The record's JSON with its keys sorted: the values and their JSON types, whatever the order."""
    return json.dumps(record, sort_keys=True, separators=(",", ":"))


def test_the_records_of_fixed_inputs_are_the_snapshots(clock):
    lines = [_canonical(r) for r in (*_kinds_records(), *_vision_records())]
    assert len(lines) == 5 and '"refused"' in lines[3]
    if os.environ.get("PACKSCOPE_WRITE_SNAPSHOT"):
        SNAPSHOT.write_text("".join(line + "\n" for line in lines))
    assert lines == SNAPSHOT.read_text().splitlines()
