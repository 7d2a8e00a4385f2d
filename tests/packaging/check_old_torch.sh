#!/usr/bin/env bash
# The agent against one torch release, in a fresh venv: the CPU agent tests, and the torch APIs
# that only the CUDA paths reach (so a CPU run cannot exercise them). This is how the floor in
# pyproject's [agent] extra was found (torch>=2.6): on 2.5.1 the CPU tests pass, but torch has
# no torch.accelerator, and SyncCounter.install() (CUDA only) fails with AttributeError.
# Usage: tests/packaging/check_old_torch.sh TORCH_VERSION [WORK_DIR]
# Releases other than the machine's local CPU wheel come from PyPI as CUDA builds (~3.7 GB installed).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
V=${1:?usage: check_old_torch.sh TORCH_VERSION [WORK_DIR]}
WORK=${2:-$(mktemp -d -t packscope-torch.XXXXXX)}
PY=${PYTHON:-python3}
VENV=$WORK/venv-torch$V

"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==$V" pytest hypothesis
# --no-deps: the agent's tests need torch and the standard library only, not the server.
"$VENV/bin/python" -m pip install -q --no-deps -e "$ROOT"

echo "== torch APIs the agent uses on CUDA (agent/timing.py, agent/agent.py, agent/syncs.py)"
(cd "$WORK" && "$VENV/bin/python" - <<'EOF'
import torch

checks = {
    "torch.Event(device, enable_timing=True)": lambda: torch.Event(torch.device("cpu"), enable_timing=True),
    "torch.accelerator.synchronize": lambda: torch.accelerator.synchronize,
    "torch.cuda.get_sync_debug_mode / set_sync_debug_mode": lambda: (torch.cuda.get_sync_debug_mode, torch.cuda.set_sync_debug_mode),
    "torch.bucketize(right=True)": lambda: torch.bucketize(torch.tensor([1, 2]), torch.tensor([0, 2]), right=True),
    "torch.empty(pin_memory=...)": lambda: torch.empty(1, pin_memory=False),
}
print("torch", torch.__version__)
bad = 0
for name, probe in checks.items():
    try:
        probe()
        print(f"  ok       {name}")
    except Exception as exc:  # noqa: BLE001 - any failure is the finding
        bad += 1
        print(f"  MISSING  {name}: {type(exc).__name__}: {exc}")

# SyncCounter.install as on a GPU machine (the debug-mode calls need a driver, so they are stubbed).
torch.cuda.is_available = lambda: True
torch.cuda.get_sync_debug_mode = lambda: 0
torch.cuda.set_sync_debug_mode = lambda mode: None
from packscope.agent.syncs import SyncCounter

try:
    SyncCounter().install().uninstall()
    print("  ok       SyncCounter.install() on the CUDA path")
except Exception as exc:  # noqa: BLE001
    bad += 1
    print(f"  FAILS    SyncCounter.install() on the CUDA path: {type(exc).__name__}: {exc}")
raise SystemExit(1 if bad else 0)
EOF
) && api=0 || api=$?

echo "== tests/agent (CPU) with torch $V"
(cd "$ROOT" && "$VENV/bin/python" -m pytest -q -p no:cacheprovider tests/agent) && tests=0 || tests=$?
echo "check_old_torch: torch $V: API probe exit $api, tests/agent exit $tests"
[ "$api" -eq 0 ] && [ "$tests" -eq 0 ]
