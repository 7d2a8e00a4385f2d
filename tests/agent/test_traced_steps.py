"""The agent's traced steps (docs/ledger.md) with a stand-in for CUPTI's activity API: which steps
are traced (from the second step of an interval whose syncs are counted, `trace_idle_steps` of
them, never while the last trace is unread), that no other step calls the tracer, and what the
record carries from gpu_idle's split of the records the tracer hands over."""

import types

import pytest

from packscope.agent import Agent, AgentConfig, ModelSpec
from packscope.agent.gpu_idle import Busy, HostSync

MODEL = ModelSpec(layers=2, hidden=64, heads=4, ffn=128, vocab=256)


class FakeTracer:
    """IdleTracer's surface: a clock that ticks 1000 ns a read, and, at take, a timeline for
    the traced steps: each step 0..100 µs busy, then 30 µs idle after a sync at 90 µs."""

    def __init__(self) -> None:
        self.now, self.calls, self.on = 0, [], False
        self.windows: list[tuple[int, int]] = []

    def timestamp(self) -> int:
        self.calls.append("timestamp")
        self.now += 1000
        return self.now

    def start(self) -> None:
        self.calls.append("start")
        self.on = True

    def stop(self) -> None:
        self.calls.append("stop")
        self.on = False

    def take(self):
        self.calls.append("take")
        return self.delivered()

    def delivered(self):
        busy, syncs = [], []
        for begin, end in self.windows:
            busy += [Busy(begin, begin + 100_000), Busy(begin + 130_000, end)]
            syncs.append(HostSync(begin + 90_000, begin + 101_000))
        self.windows = []
        return busy, syncs


def traced_agent(monkeypatch, **config) -> tuple[Agent, FakeTracer]:
    tracer = FakeTracer()
    agent = Agent(AgentConfig(sample_gpu=False, run_id="traced", count_syncs_every=2, **config), model=MODEL)
    agent.syncs.installed = True  # a counter as on a GPU (install() is a no-op without CUDA)...
    monkeypatch.setattr(agent.syncs, "_counting_switched", lambda on: None)  # ...without CUDA's debug mode
    agent._tracer = tracer
    agent._plan_trace()
    # The step timer reads the tracer's clock (on the CPU the step time is the host clock's).
    monkeypatch.setattr("packscope.agent.timing.time", types.SimpleNamespace(perf_counter=lambda: tracer.now / 1e9))
    return agent, tracer


def run(agent: Agent, tracer: FakeTracer, steps: int) -> dict[int, list[str]]:
    calls = {}
    for _ in range(steps):
        before = len(tracer.calls)
        agent.step_begin()
        begin = tracer.now
        agent.observe_batch(shape=(1, 64))
        tracer.now += 200_000  # the step's host time: 200 µs
        agent.step_end()
        if "start" in tracer.calls[before:] or tracer.on or "stop" in tracer.calls[before:]:
            tracer.windows.append((begin, tracer.now))
        calls[agent.step] = tracer.calls[before:]
    agent.syncs.installed = False  # nothing of CUDA's to take off
    agent.close()
    return calls


def test_three_steps_from_each_counted_intervals_second_are_traced_and_no_other(monkeypatch):
    agent, tracer = traced_agent(monkeypatch, log_every=5, trace_idle_steps=3)
    calls = run(agent, tracer, 25)
    # Counted intervals: the first two, then one in two after the first (count_syncs_every=2): 0, 1, 3.
    traced = sorted(step for step, c in calls.items() if "timestamp" in c)
    assert traced == [2, 3, 4, 7, 8, 9, 17, 18, 19]
    untraced = [c for step, c in calls.items() if step not in traced]
    assert all(c in ([], ["take"]) for c in untraced) and untraced.count(["take"]) == 3  # the reads
    assert calls[2][:2] == ["start", "timestamp"] and calls[4][-1] == "stop"
    records = {r["interval"]: r for r in agent.records}
    assert [i for i, r in records.items() if r.get("traced_steps")] == [0, 1, 3]
    assert "traced_steps" not in records[2]


def test_the_record_carries_the_split_of_the_traced_steps(monkeypatch):
    agent, tracer = traced_agent(monkeypatch, log_every=5, trace_idle_steps=3)
    run(agent, tracer, 10)
    r = agent.records[0]
    assert r["traced_steps"] == 3
    assert r["traced_step_time_s"] == pytest.approx(3 * 0.0002, rel=0.05)  # 200 µs each, and a tick of the clock
    # Each traced step: 30 µs after its sync (charged to no site: none was counted), the rest of
    # the step's 200 µs window busy; the gaps between steps are the data wait's.
    assert r["sync_idle_s"] == pytest.approx(3 * 30e-6)
    assert r["launch_idle_s"] == 0
    assert r["traced_busy_s"] == pytest.approx(3 * 170e-6, rel=0.02)


def test_a_trace_waits_while_the_last_one_is_unread(monkeypatch):
    agent, tracer = traced_agent(monkeypatch, log_every=5, trace_idle_steps=3)
    agent._trace_pending = True  # as if interval 0 of another trace were still on its way
    calls = run(agent, tracer, 5)
    assert all("start" not in c for c in calls.values())
    assert "traced_steps" not in agent.records[0]
