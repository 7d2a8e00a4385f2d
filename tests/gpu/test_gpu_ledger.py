"""The ledger's measurements on a real GPU (docs/ledger.md): the data wait from the step events'
gaps, and CUPTI's activity trace of a few steps pricing the host syncs (by site) and the
host-/launch-bound idle, without adding a host sync.

Run on the GPU machine: ``python -m pytest -m gpu tests/gpu/test_gpu_ledger.py`` (cupti-python on
the path: bash bench/gpu_session.sh ledger).
"""

import time

import pytest
import torch

from packscope.agent import Agent, AgentConfig, ModelSpec
from packscope.agent.sync_sites import shown_path

pytestmark = pytest.mark.gpu  # deselected by default (pyproject addopts); run with -m gpu

MODEL = ModelSpec(layers=2, hidden=64, heads=4, ffn=128, vocab=256)
HERE = shown_path(__file__)


def matmuls(x, w, n):
    for _ in range(n):
        x = torch.tanh(x @ w)
    return x


def run_steps(agent, step, steps, between=None):
    """`between(i)`: the host's work after step i's end (the next batch, a logger's output)."""
    for i in range(steps):
        agent.step_begin()
        agent.observe_batch(shape=(1, 64))
        step(i)
        agent.step_end()
        if between is not None:
            between(i)
    agent.close()
    return list(agent.records)


def cupti_agent(**config) -> Agent:
    from packscope.agent.cupti import CuptiUnavailable

    try:
        return Agent(AgentConfig(sync_backend="cupti", count_syncs_every=1, sample_gpu=False, **config), model=MODEL)
    except CuptiUnavailable as exc:
        pytest.fail(f"CUPTI backend unavailable on the GPU machine: {exc}")


def test_a_slow_loader_is_the_data_wait_and_a_queued_gpu_is_not():
    dev = torch.device("cuda")
    x, w = torch.randn(4096, 4096, device=dev), torch.randn(4096, 4096, device=dev) / 64
    matmuls(x, w, 4)
    torch.cuda.synchronize()

    def slow_loader(i):
        time.sleep(0.02)  # the GPU drains while the host waits: ~20 ms idle per gap, less the queued work
        matmuls(x, w, 2)

    agent = Agent(AgentConfig(log_every=10, count_syncs=False, sample_gpu=False), model=MODEL)
    steady = run_steps(agent, slow_loader, 30)[1:]
    wait = sum(r["data_wait_s"] for r in steady) / sum(r["data_wait_gaps"] for r in steady)
    step = sum(r["gpu_time_s"] for r in steady) / sum(r["steps"] for r in steady)
    assert 0.02 - step - 0.002 < wait < 0.025, (wait, step)

    agent = Agent(AgentConfig(log_every=10, count_syncs=False, sample_gpu=False), model=MODEL)
    steady = run_steps(agent, lambda i: matmuls(x, w, 8), 30)[1:]  # the host far ahead: no gap
    wait = sum(r["data_wait_s"] for r in steady) / sum(r["data_wait_gaps"] for r in steady)
    assert wait < 50e-6, wait


def test_the_trace_charges_a_syncs_idle_to_its_line_and_adds_no_sync():
    dev = torch.device("cuda")
    x, w = torch.randn(4096, 4096, device=dev), torch.randn(4096, 4096, device=dev) / 64
    small = torch.randn(64, 64, device=dev)

    def synced_step(i):
        y = matmuls(x, w, 4)
        y.sum().item()  # the host waits for the GPU to drain
        time.sleep(0.002)  # ...then takes its time to launch again: ~2 ms idle after the sync
        matmuls(small, small, 4)

    agent = cupti_agent(log_every=6, trace_idle_steps=3)
    recs = run_steps(agent, synced_step, 24)
    traced = [r for r in recs if r.get("traced_steps")]
    assert traced, "no interval was traced"
    for r in traced:
        assert r["traced_steps"] == 3
        share = r["sync_idle_s"] / r["traced_step_time_s"]
        assert r["sync_idle_s"] > 3 * 0.0015, r  # three steps, each ~2 ms after its sync
        assert r["launch_idle_s"] < r["sync_idle_s"], r
        assert 0 < share < 1
        assert r["traced_busy_s"] <= r["traced_step_time_s"] * 1.01
    sites = {s["site"] for r in recs for s in r["syncs"]["sites"]}
    assert any(site.startswith(f"{HERE}:") for site in sites), sites


def test_a_sync_at_the_steps_end_owns_the_idle_between_steps_that_follows():
    """A legacy logger: `.item()` at the end of the step drains the GPU, then the host spends
    ~3 ms before the next step: the gap between steps is the sync's (sync_idle_between_s), about
    the data wait per gap, while the same host time behind no sync is not."""
    dev = torch.device("cuda")
    x, w = torch.randn(4096, 4096, device=dev), torch.randn(4096, 4096, device=dev) / 64

    def logged_step(i):
        matmuls(x, w, 4).sum().item()  # the host waits for the GPU to drain, inside the step

    def plain_step(i):
        matmuls(x, w, 4)

    def next_batch(i):
        time.sleep(0.003)

    recs = run_steps(cupti_agent(log_every=6, trace_idle_steps=3), logged_step, 24, between=next_batch)
    traced = [r for r in recs[1:] if r.get("traced_gaps")]
    assert traced, "no interval traced two steps"
    per_gap = sum(r["sync_idle_between_s"] for r in traced) / sum(r["traced_gaps"] for r in traced)
    wait = sum(r["data_wait_s"] for r in traced) / sum(r["data_wait_gaps"] for r in traced)
    assert 0.002 < per_gap < 0.006, (per_gap, wait)
    assert per_gap == pytest.approx(wait, rel=0.25), (per_gap, wait)
    # The host runs ahead here, so a later interval's trace may wait for an unread one: the first
    # interval's (nothing unread before it) is enough.
    recs = run_steps(cupti_agent(log_every=6, trace_idle_steps=3), plain_step, 24, between=next_batch)
    traced = [r for r in recs if r.get("traced_gaps")]
    assert traced and all(r["sync_idle_between_s"] == 0 for r in traced), traced


def test_a_loop_of_reads_is_the_syncs_loop_idle():
    """A per-document loop: after the forward, 64 reads of a tiny kernel's result, each returning
    at once on an idle GPU: the idle between them is the syncs' loop (sync_loop_idle_s), most of
    the sync idle, and its closing reads waited little."""
    dev = torch.device("cuda")
    x, w = torch.randn(2048, 2048, device=dev), torch.randn(2048, 2048, device=dev) / 45
    docs = torch.randn(64, 128, device=dev)

    def looped_step(i):
        matmuls(x, w, 4)
        for d in range(64):
            if docs[d].sum().item() > 1e9:  # sync per document, read into control flow
                raise AssertionError

    recs = run_steps(cupti_agent(log_every=6, trace_idle_steps=3), looped_step, 24)
    traced = [r for r in recs if r.get("traced_steps")]
    assert traced
    for r in traced:
        assert r["sync_loop_idle_s"] > 0.5 * r["sync_idle_s"] > 0, r
        assert r["sync_loop_blocked_s"] < r["sync_loop_idle_s"], r


def test_a_launch_bound_step_is_launch_idle_not_sync_idle():
    dev = torch.device("cuda")
    tiny = torch.randn(8, 8, device=dev)

    def launch_bound(i):
        y = tiny
        for _ in range(300):  # tiny kernels: the GPU finishes each before Python launches the next
            y = y * 1.0001 + 0.0001  # no sync anywhere

    agent = cupti_agent(log_every=6, trace_idle_steps=3)
    recs = run_steps(agent, launch_bound, 24)
    traced = [r for r in recs if r.get("traced_steps")]
    assert traced
    for r in traced:
        assert r["launch_idle_s"] > 0.3 * r["traced_step_time_s"], r  # most of the step is the host's launches
        assert r["sync_idle_s"] == 0, r
    assert sum(r["syncs"]["total"] for r in recs) == 0  # the trace adds no host sync


def test_tracing_adds_no_sync_to_a_sync_free_loop():
    dev = torch.device("cuda")
    x, w = torch.randn(2048, 2048, device=dev), torch.randn(2048, 2048, device=dev) / 45
    agent = cupti_agent(log_every=5, trace_idle_steps=3)
    recs = run_steps(agent, lambda i: matmuls(x, w, 4), 40)
    assert any(r.get("traced_steps") for r in recs)
    assert sum(r["syncs"]["total"] for r in recs) == 0, [r["syncs"] for r in recs]
