"""Optional GPU telemetry through NVML (``pip install 'packscope[nvml]'``, i.e. nvidia-ml-py).

A daemon thread samples utilization, power, SM clock, memory and the board's energy counter
every ``period_s``; each interval record gets the means of the samples taken since the previous
record, and the energy used between the last samples before the two records (so the energy
window is shifted by less than one period). The trainer thread makes no NVML call: it only
takes a lock to read the running sums, so sampling never touches the hot path (a driver query
can take milliseconds).
"""

from __future__ import annotations

import logging
import threading

log = logging.getLogger("packscope.agent")
# The readings, by the catalogue name of the record field each is sent as (packscope.core.catalogue).
FIELDS = ("gpu_util_pct", "gpu_power_w", "gpu_sm_clock_mhz", "gpu_mem_used_bytes")


class NvmlSampler:
    def __init__(self, device_index: int, period_s: float = 0.1) -> None:
        import pynvml  # nvidia-ml-py

        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handle = pynvml.nvmlDeviceGetHandleByIndex(device_index)
        self._period_s = period_s
        self._lock = threading.Lock()
        self._sums = dict.fromkeys(FIELDS, 0.0)
        self._n = 0
        self._energy_mj = self._energy()  # the counter at the last take()
        self._energy_latest_mj = self._energy_mj  # the counter at the latest sample
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="packscope-nvml", daemon=True)
        self._thread.start()

    @classmethod
    def try_start(cls, device_index: int) -> NvmlSampler | None:
        """A sampler, or None (with one log line) where NVML or its Python binding is missing."""
        try:
            return cls(device_index)
        except Exception as exc:  # noqa: BLE001 - ImportError, NVMLError: telemetry is optional
            log.info("packscope: no GPU telemetry (%s)", exc)
            return None

    def _energy(self) -> float | None:
        try:
            return float(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))
        except self._nvml.NVMLError:
            return None

    def _sample(self) -> dict[str, float]:
        n = self._nvml
        return {
            "gpu_util_pct": float(n.nvmlDeviceGetUtilizationRates(self._handle).gpu),
            "gpu_power_w": n.nvmlDeviceGetPowerUsage(self._handle) / 1e3,
            "gpu_sm_clock_mhz": float(n.nvmlDeviceGetClockInfo(self._handle, n.NVML_CLOCK_SM)),
            "gpu_mem_used_bytes": float(n.nvmlDeviceGetMemoryInfo(self._handle).used),
        }

    def _loop(self) -> None:
        while not self._stop.wait(self._period_s):
            try:
                sample = self._sample()
            except self._nvml.NVMLError as exc:
                log.warning("packscope: NVML sampling stopped: %s", exc)
                return
            energy = self._energy()
            with self._lock:
                for key, value in sample.items():
                    self._sums[key] += value
                self._n += 1
                self._energy_latest_mj = energy

    def take(self) -> dict[str, float] | None:
        """Means since the last call, plus the energy used meanwhile (joules)."""
        with self._lock:
            sums, n, energy = self._sums, self._n, self._energy_latest_mj
            self._sums, self._n = dict.fromkeys(FIELDS, 0.0), 0
        if n == 0:
            return None
        out = {key: value / n for key, value in sums.items()}
        if energy is not None and self._energy_mj is not None:
            out["gpu_energy_j"] = (energy - self._energy_mj) / 1e3
        self._energy_mj = energy
        return out

    def close(self) -> None:
        self._stop.set()
        self._thread.join(1.0)
