"""What the run runs on, and the peak dense bf16 rate that MFU divides by."""

from __future__ import annotations

import torch

# Dense (no sparsity) bf16 tensor-core peaks in TFLOP/s, from the vendors' datasheets.
PEAK_BF16_TFLOPS = {
    "H200": 989.4,
    "H100 SXM": 989.4,
    "H100 PCIe": 756.0,
    "H100 NVL": 835.0,
    "H100": 989.4,
    "H20": 148.0,
    "GH200": 989.4,
    "B200": 2250.0,
    "A100": 312.0,
    "A10G": 70.0,
    "L40S": 362.0,
    "L4": 121.0,
}


def peak_tflops_for(gpu_name: str) -> float | None:
    """Longest matching key wins, so 'H100 PCIe' is not read as 'H100'."""
    for key in sorted(PEAK_BF16_TFLOPS, key=len, reverse=True):
        if key.lower() in gpu_name.lower():
            return PEAK_BF16_TFLOPS[key]
    return None


def describe(device: torch.device, gpu_count: int, peak_tflops: float | None) -> dict:
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        peak = peak_tflops if peak_tflops is not None else peak_tflops_for(name)
        # The device's total memory, read once from its properties (no sync): the ledger's
        # memory headroom hint beside NVML's memory in use.
        memory = int(torch.cuda.get_device_properties(device).total_memory)
        return {"gpu_name": name, "gpu_count": gpu_count, "peak_tflops": peak, "memory_bytes": memory}
    return {"gpu_name": "cpu", "gpu_count": gpu_count, "peak_tflops": peak_tflops}
