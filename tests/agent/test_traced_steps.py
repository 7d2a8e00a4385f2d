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


class LoggerTracer(FakeTracer):
    """A legacy logger's timeline: each step busy from 10 µs to 150 µs, where a sync at its end
    (60..151 µs: 90 µs of queued work) drains the GPU, which then idles through the host's time
    between steps until the next step's first launch."""

    def delivered(self):
        busy = [Busy(begin + 10_000, begin + 150_000) for begin, _ in self.windows]
        syncs = [HostSync(begin + 60_000, begin + 151_000) for begin, _ in self.windows]
        self.windows = []
        return busy, syncs


def run(
    agent: Agent, tracer: FakeTracer, steps: int, between_ns: int = 0, agent_after: int | None = None
) -> dict[int, list[str]]:
    """`between_ns`: the host's time between steps; `agent_after`: a step after whose end the
    agent does its own work (as an emission would)."""
    calls = {}
    for _ in range(steps):
        before = len(tracer.calls)
        tracer.now += between_ns  # the host's work between steps (the next batch)
        agent.step_begin()
        begin = tracer.now
        agent.observe_batch(shape=(1, 64))
        tracer.now += 200_000  # the step's host time: 200 µs
        agent.step_end()
        if agent.step == agent_after:
            agent._timer.agent_worked()
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
    # Each step's sync returned 100 µs before its end and the GPU then ran 71 µs, a few small
    # kernels' worth (queue_ns): the step left nothing queued, so the idle between the steps (a
    # clock tick each side, under the 11 µs the sync drained) is the sync's too
    # (tests/agent/test_gpu_idle.py holds the rule).
    assert (r["traced_gaps"], r["sync_idle_between_s"]) == (2, pytest.approx(2 * 1e-6))
    # The host sat in each step's sync for 11 µs (90..101), none of it between the steps.
    assert (r["sync_blocked_s"], r["sync_blocked_between_s"]) == (pytest.approx(3 * 11e-6), 0)


def test_the_record_carries_the_syncs_idle_between_the_traced_steps(monkeypatch):
    agent, tracer = traced_agent(monkeypatch, log_every=5, trace_idle_steps=3)
    tracer.__class__ = LoggerTracer
    run(agent, tracer, 10, between_ns=50_000)
    r = agent.records[0]
    # Between two traced steps: 50 µs of the host's own (a clock tick each side of it), all of
    # it after the sync that drained the GPU; two such gaps. The data wait measures the same gaps
    # (on the CPU by the host clock) over every pair of steps.
    assert (r["traced_gaps"], r["sync_idle_between_s"]) == (2, pytest.approx(2 * 51e-6, rel=0.05))
    assert r["data_wait_s"] / r["data_wait_gaps"] == pytest.approx(r["sync_idle_between_s"] / 2, rel=0.05)
    # Inside the steps, in the same two gaps: from 150 µs to the step's end (201: a clock tick),
    # and the next step's first 10 µs (the timeline ends with the last step's last kernel).
    assert r["sync_idle_s"] == pytest.approx(2 * (51e-6 + 10e-6), rel=0.05)
    # The host waited 91 µs in each step's sync (60..151), inside the step.
    assert (r["sync_blocked_s"], r["sync_blocked_between_s"]) == (pytest.approx(3 * 91e-6), 0)


def test_a_gap_the_agent_worked_in_is_not_the_syncs_between_steps(monkeypatch):
    agent, tracer = traced_agent(monkeypatch, log_every=5, trace_idle_steps=3)
    tracer.__class__ = LoggerTracer
    run(agent, tracer, 10, between_ns=50_000, agent_after=3)  # traced steps 2, 3, 4: the gap before 4
    r = agent.records[0]
    assert (r["traced_gaps"], r["sync_idle_between_s"]) == (1, pytest.approx(51e-6, rel=0.05))
    assert r["data_wait_gaps"] == 3  # the data wait leaves the same gap out


def test_a_trace_waits_while_the_last_one_is_unread(monkeypatch):
    agent, tracer = traced_agent(monkeypatch, log_every=5, trace_idle_steps=3)
    agent._trace_pending = True  # as if interval 0 of another trace were still on its way
    calls = run(agent, tracer, 5)
    assert all("start" not in c for c in calls.values())
    assert "traced_steps" not in agent.records[0]
