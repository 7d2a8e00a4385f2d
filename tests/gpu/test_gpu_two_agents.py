"""Several agents in one process on a GPU, as notebooks and sweeps run them (issue 34: the second
Trainer of bench/agent_overhead.py crashed on the first warning, KeyError 'showwarning'). Each
agent counts the syncs of its own steps; once all are closed, warnings and PyTorch's sync debug
mode are as the program had them. Every install/uninstall order is tested on CPU with a simulated
device (tests/agent/test_sync_orders.py); this is the real one.

Run on the GPU machine: ``python -m pytest -m gpu tests/gpu``.
"""

from __future__ import annotations

import warnings

import pytest
import torch

from packscope.agent import Agent, AgentConfig, ModelSpec

pytestmark = pytest.mark.gpu

MODEL = ModelSpec(layers=2, hidden=64, heads=4, ffn=128, vocab=256)
STEPS = 5


def agent() -> Agent:
    return Agent(AgentConfig(log_every=STEPS, count_syncs=True, count_syncs_every=1), model=MODEL)


def train(a: Agent, x: torch.Tensor, syncs_per_step: int) -> None:
    for _ in range(STEPS):
        a.step_begin()
        for _ in range(syncs_per_step):
            x.sum().item()
        a.step_end()


def assert_left_as_found(showwarning) -> None:
    assert warnings.showwarning is showwarning
    assert torch.cuda.get_sync_debug_mode() == 0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.warn("a warning after the agents", UserWarning, stacklevel=1)
    assert [str(w.message) for w in caught] == ["a warning after the agents"]
    warnings.warn("a warning through the program's own hook", UserWarning, stacklevel=1)  # raised nothing


def test_two_agents_one_after_the_other_each_count_their_own_syncs():
    showwarning = warnings.showwarning
    x = torch.randn(64, device="cuda")
    first = agent()
    train(first, x, 2)
    first.close()
    second = agent()
    train(second, x, 3)
    second.close()
    assert [r["syncs"]["total"] for r in first.records] == [2 * STEPS]
    assert [r["syncs"]["total"] for r in second.records] == [3 * STEPS]
    assert_left_as_found(showwarning)


@pytest.mark.parametrize("closed_first", ["first", "second"])
def test_two_open_agents_closed_in_either_order_leave_warnings_working(closed_first):
    showwarning = warnings.showwarning
    x = torch.randn(64, device="cuda")
    agents = {"first": agent(), "second": agent()}
    train(agents["first"], x, 1)
    train(agents["second"], x, 1)
    agents[closed_first].close()
    warnings.warn("a warning between the closes", UserWarning, stacklevel=1)  # the reported crash
    x.sum().item()  # a sync with one counter left
    agents["second" if closed_first == "first" else "first"].close()
    assert all(r["syncs"]["total"] >= STEPS for a in agents.values() for r in a.records)
    assert_left_as_found(showwarning)
