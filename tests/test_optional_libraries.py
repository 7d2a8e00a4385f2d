"""The training libraries are optional extras (pyproject: hf, lightning, torchtitan): without them
the suite is collected whole and their tests are skipped, never a collection error. Checked in a
fresh interpreter where importing any of them fails, as where they are not installed."""

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow  # a fresh interpreter collects the whole suite: 10-15 s here

OPTIONAL = ("transformers", "trl", "datasets", "accelerate", "lightning", "torchtitan", "tokenizers")
TESTS = Path(__file__).resolve().parent

COLLECT_WITHOUT = f"""
import sys, pytest
for name in {OPTIONAL!r}:
    sys.modules[name] = None  # import raises ImportError, as for a package not installed
sys.exit(pytest.main(["-q", "-p", "no:cacheprovider", "--collect-only", "-rs", {str(TESTS)!r}]))
"""


def test_the_suite_is_collected_without_the_training_libraries():
    done = subprocess.run(
        [sys.executable, "-c", COLLECT_WITHOUT], capture_output=True, text=True, timeout=600, cwd=TESTS.parent
    )
    assert done.returncode == 0, done.stdout[-5000:] + done.stderr[-3000:]
    skipped = done.stdout.split("short test summary info")[-1]
    for module in ("test_integrations_hf.py", "test_integration_layouts.py", "test_integrations_lightning.py"):
        assert module in skipped, done.stdout[-5000:]
