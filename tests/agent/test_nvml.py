"""The NVML sampler, against a fake pynvml: every NVML call happens on the sampler's thread."""

from __future__ import annotations

import sys
import threading
import time
import types

import pytest

from packscope.agent.nvml import NvmlSampler


class FakeNvml(types.ModuleType):
    """Just enough of pynvml; the energy counter grows by 1000 mJ per read."""

    NVML_CLOCK_SM = 1

    class NVMLError(Exception):
        pass

    def __init__(self) -> None:
        super().__init__("pynvml")
        self.calls_by_thread: dict[str, int] = {}
        self.energy_mj = 0

    def _call(self) -> None:
        name = threading.current_thread().name
        self.calls_by_thread[name] = self.calls_by_thread.get(name, 0) + 1

    def nvmlInit(self) -> None:
        pass

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        return object()

    def nvmlDeviceGetUtilizationRates(self, handle) -> types.SimpleNamespace:
        self._call()
        return types.SimpleNamespace(gpu=80)

    def nvmlDeviceGetPowerUsage(self, handle) -> int:
        self._call()
        return 300_000  # mW

    def nvmlDeviceGetClockInfo(self, handle, clock) -> int:
        self._call()
        return 1800

    def nvmlDeviceGetMemoryInfo(self, handle) -> types.SimpleNamespace:
        self._call()
        return types.SimpleNamespace(used=2**30)

    def nvmlDeviceGetTotalEnergyConsumption(self, handle) -> int:
        self._call()
        self.energy_mj += 1000
        return self.energy_mj


@pytest.fixture
def fake_nvml(monkeypatch):
    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    return fake


def wait_for_samples(fake: FakeNvml, n: int) -> None:
    deadline = time.monotonic() + 5
    while fake.calls_by_thread.get("packscope-nvml", 0) < 5 * n:
        assert time.monotonic() < deadline, "the sampler thread took no samples"
        time.sleep(0.005)


def test_take_makes_no_nvml_call_on_the_callers_thread(fake_nvml):
    sampler = NvmlSampler(0, period_s=0.01)
    calls_at_start = dict(fake_nvml.calls_by_thread)  # the first energy read, at construction
    wait_for_samples(fake_nvml, 3)
    got = sampler.take()
    sampler.close()
    me = threading.current_thread().name
    assert fake_nvml.calls_by_thread.get(me, 0) == calls_at_start.get(me, 0)
    assert got["gpu_util_pct"] == 80 and got["gpu_power_w"] == 300 and got["gpu_sm_clock_mhz"] == 1800
    assert got["gpu_mem_used_bytes"] == 2**30
    # Energy: from the counter at construction to the latest of at least 3 samples (1 J each).
    assert got["gpu_energy_j"] >= 3.0


def test_consecutive_windows_add_up_to_the_counter(fake_nvml):
    sampler = NvmlSampler(0, period_s=0.01)
    windows = []
    for i in range(3):
        before = fake_nvml.calls_by_thread.get("packscope-nvml", 0)
        wait_for_samples(fake_nvml, before // 5 + 2)
        if i == 2:
            sampler.close()  # the counter stops moving: the last window is exact
        windows.append(sampler.take()["gpu_energy_j"])
    # Nothing lost or counted twice between windows: they sum to the counter's whole advance.
    assert sum(windows) == pytest.approx((fake_nvml.energy_mj - 1000) / 1e3)
    assert all(w > 0 for w in windows)


def test_take_without_samples_is_none(fake_nvml):
    sampler = NvmlSampler(0, period_s=60)
    assert sampler.take() is None
    sampler.close()
