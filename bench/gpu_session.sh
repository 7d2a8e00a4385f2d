#!/usr/bin/env bash
# Everything that needs the H200, in one call: gpu-marked tests, then the GPU benchmarks.
# Run from the repository root on the device machine; results land in $OUT.
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then  # carried wheels (cupti-python); the machine has no registry
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
{ nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,power.limit --format=csv
  python3 -c "import torch, inspect; from torch.nn.attention.varlen import varlen_attn as v; print(torch.__version__, torch.version.cuda, inspect.signature(v))"
} 2>&1 | tee "$OUT/device.txt"
python3 -m pytest -m gpu tests/gpu tests/trainer -v -s -p no:cacheprovider 2>&1 | tee "$OUT/gpu_tests.log" | grep -E "PASSED|FAILED|ERROR|passed|failed|syncs|nvml" | tail -40
python3 bench/agent_overhead.py --out "$OUT/agent_overhead.json" > /dev/null 2> "$OUT/agent_overhead.err"; tail -3 "$OUT/agent_overhead.err"
python3 bench/trainer_throughput.py --out "$OUT/trainer_throughput.json" > /dev/null 2> "$OUT/trainer_throughput.err"; tail -6 "$OUT/trainer_throughput.err"
