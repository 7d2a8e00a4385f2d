#!/usr/bin/env bash
# Everything that needs the H200, for one device call from the repository root:
# the gpu-marked tests, then the GPU benchmarks; logs and JSON land in $OUT.
# The device machine has torch but no registry: cupti-python travels as a wheel in .whl/.
set -uo pipefail
export PYTHONUNBUFFERED=1 OUT="${OUT:-/tmp/packscope-gpu}"
mkdir -p "$OUT"
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site
fi
python3 -m pip install -q --no-index --no-deps --no-build-isolation -e . || exit 1
python3 -m pytest -m gpu tests/gpu tests/trainer -v -s -p no:cacheprovider > "$OUT/gpu_tests.log" 2>&1
tail -1 "$OUT/gpu_tests.log"
python3 bench/agent_overhead.py --out "$OUT/agent_overhead.json" > /dev/null 2> "$OUT/agent_overhead.err"
tail -14 "$OUT/agent_overhead.err"
python3 bench/agent_overhead.py --presets 1b --no-compile --steps-per-mode 100 --out "$OUT/agent_overhead_1b.json" \
  > /dev/null 2> "$OUT/agent_overhead_1b.err"
tail -7 "$OUT/agent_overhead_1b.err"
python3 bench/trainer_throughput.py --out "$OUT/trainer_throughput.json" > /dev/null 2> "$OUT/trainer_throughput.err"
python3 bench/trainer_throughput.py --compile --layouts thd --out "$OUT/trainer_throughput_compiled.json" > /dev/null 2> "$OUT/trainer_throughput_compiled.err"
tail -6 "$OUT/trainer_throughput.err" "$OUT/trainer_throughput_compiled.err"
