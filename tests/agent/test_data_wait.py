"""The data wait on the CPU: the host clock's gap between one step's end and the next one's
begin, summed over the interval's consecutive steps; the gap before an interval's first step
(where the agent's boundary work runs) is left out, as the first step of the run has none."""

import types

import pytest

from packscope.agent import Agent, AgentConfig, ModelSpec
from packscope.agent.timing import StepTimer

MODEL = ModelSpec(layers=2, hidden=64, heads=4, ffn=128, vocab=256)


class Clock:
    """A host clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def read(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = Clock()
    fake_time = types.SimpleNamespace(time=fake.read, perf_counter=fake.read)
    monkeypatch.setattr("packscope.agent.agent.time", fake_time)
    monkeypatch.setattr("packscope.agent.timing.time", fake_time)
    return fake


def test_the_timer_gives_each_step_its_gap_from_the_one_before(clock):
    import torch

    timer = StepTimer(torch.device("cpu"))
    waits = [0.5, 0.25, 0.0, 2.0]
    for step, wait in enumerate(waits, start=1):
        clock.now += wait
        timer.begin(step)
        clock.now += 0.125  # the step itself
        timer.end()
    times = timer.poll()
    assert [t.gap_before_s for t in times] == [None, 0.25, 0.0, 2.0]
    assert [t.gpu_s for t in times] == [0.125] * 4


def test_an_intervals_data_wait_sums_its_inner_gaps(clock):
    agent = Agent(AgentConfig(log_every=4, count_syncs=False, sample_gpu=False, run_id="wait"), model=MODEL)
    waits = [0.0, 0.5, 0.25, 0.75, 4.0, 1.0, 0.0, 0.5]  # before each step; 4.0 before interval 1's first
    for wait in waits:
        clock.now += wait
        agent.step_begin()
        agent.observe_batch(shape=(1, 64))
        clock.now += 0.125
        agent.step_end()
    agent.close()
    first, second = agent.records
    assert (first["data_wait_gaps"], first["data_wait_s"]) == (3, pytest.approx(0.5 + 0.25 + 0.75))
    assert (second["data_wait_gaps"], second["data_wait_s"]) == (3, pytest.approx(1.0 + 0.0 + 0.5))


def test_a_one_step_interval_has_no_gap_to_measure(clock):
    agent = Agent(AgentConfig(log_every=1, count_syncs=False, sample_gpu=False, run_id="one"), model=MODEL)
    for _ in range(2):
        clock.now += 1.0
        agent.step_begin()
        agent.observe_batch(shape=(1, 64))
        agent.step_end()
    agent.close()
    assert [(r["data_wait_gaps"], r["data_wait_s"]) for r in agent.records] == [(0, 0.0), (0, 0.0)]


class OneStepBehind(StepTimer):
    """A timer whose steps resolve one step late, as on a GPU the host runs ahead of: an
    interval is emitted at a step_end inside the next interval, not at its boundary."""

    def poll(self):
        held = [p for p in self._pending if p[0] == self.last_ended]
        self._pending = type(self._pending)(p for p in self._pending if p[0] != self.last_ended)
        done = super().poll()
        self._pending.extend(held)
        return done

    def drain(self):
        return super().poll()


def test_a_gap_holding_the_agents_emission_is_not_the_trainers(clock, monkeypatch):
    agent = Agent(AgentConfig(log_every=4, count_syncs=False, sample_gpu=False, run_id="late"), model=MODEL)
    agent._timer = OneStepBehind(agent._timer._device)
    emit = agent._emit

    def slow_emit(p):  # the emission's own host time: a trace read back and priced
        clock.now += 10.0
        emit(p)

    monkeypatch.setattr(agent, "_emit", slow_emit)
    waits = [0.0, 0.5, 0.25, 0.75, 4.0, 1.0, 0.0, 0.5]
    for wait in waits:
        clock.now += wait
        agent.step_begin()
        agent.observe_batch(shape=(1, 64))
        clock.now += 0.125
        agent.step_end()
    agent.close()
    first, second = agent.records
    assert (first["data_wait_gaps"], first["data_wait_s"]) == (3, pytest.approx(0.5 + 0.25 + 0.75))
    # Interval 0 was emitted at step 5's end: the gap before step 6 (1.0 s + the emission's 10 s)
    # is the agent's, left out; the trainer's gaps before steps 7 and 8 remain.
    assert (second["data_wait_gaps"], second["data_wait_s"]) == (2, pytest.approx(0.0 + 0.5))
