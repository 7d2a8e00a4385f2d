"""Every file in examples/ runs for a few steps on the CPU against a live server, prints its
run's dashboard URL, and the server holds the run: finished, every interval there, documents
counted. The torchtitan example, which needs a GPU, is only asked for its usage here."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from cli.support import clean_env, free_port, get, running_server

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
STEPS = 6  # log_every is 5 in every example: two intervals

pytestmark = pytest.mark.slow  # each example is a fresh interpreter importing torch (and its library)


# What each example imports beyond the agent and torch (their packscope extras, examples/README.md).
LIBRARIES = {
    "hf_trainer.py": ("transformers", "tokenizers"),
    "trl_sft.py": ("transformers", "trl", "datasets", "tokenizers"),
    "lightning_module.py": ("lightning",),
}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("examples") / "packscope.db") as base:
        yield base


def run(tmp_path: Path, *command: str) -> str:
    env = clean_env(OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")  # HOME: the test's own (tests/conftest.py)
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]
    return done.stdout


def stored_run(server: str, out: str) -> dict:
    match = re.search(r"dashboard: (\S+)/runs/(\S+)", out)
    assert match, out
    assert match.group(1) == server
    return get(server, f"/api/v1/runs/{match.group(2)}")


@pytest.mark.parametrize(
    "example, args",
    [
        ("plain_loop.py", []),
        ("hf_trainer.py", ["--collator", "flattening"]),
        ("hf_trainer.py", ["--collator", "padded"]),
        ("trl_sft.py", []),
        ("lightning_module.py", []),
        ("megatron_style.py", []),
    ],
    ids=["plain", "hf-flattening", "hf-padded", "trl-packing", "lightning", "megatron"],
)
def test_the_example_reaches_the_server(server, tmp_path, example, args):
    for library in LIBRARIES.get(example, ()):
        pytest.importorskip(library, reason=f"{example} needs {library}")
    out = run(tmp_path, sys.executable, str(EXAMPLES / example), "--server", server, "--steps", str(STEPS), *args)
    run_ = stored_run(server, out)
    assert run_["status"] == "finished"
    assert run_["records"] == 2  # steps 1-5 and 6
    assert run_["totals"]["documents"] > run_["totals"]["packs"] or "padded" in args
    assert run_["totals"]["real_tokens"] <= run_["totals"]["tokens"]


def test_torchrun_ddp_sends_every_rank(server, tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    torchrun += ["--master-port", str(free_port())]
    out = run(tmp_path, *torchrun, str(EXAMPLES / "ddp_torchrun.py"), "--server", server, "--steps", str(STEPS))
    run_ = stored_run(server, out)
    assert run_["status"] == "finished" and run_["records"] == 2 * 2  # two ranks, two intervals each


def test_an_offline_run_is_sent_by_sync(server, tmp_path):
    out = run(tmp_path, sys.executable, str(EXAMPLES / "plain_loop.py"), "--offline", "runs", "--steps", str(STEPS))
    assert "packscope sync runs" in out
    synced = run(tmp_path, sys.executable, "-m", "packscope", "sync", "runs", "--server", server)
    match = re.search(rf"run (\S+): {re.escape(server)}/runs/(\S+)", synced)
    assert match and match.group(1) == match.group(2), synced
    run_ = get(server, f"/api/v1/runs/{match.group(1)}")
    assert run_["records"] == 2 and run_["status"] == "finished"


def test_the_readme_lists_every_example():
    readme = (EXAMPLES / "README.md").read_text()
    assert {p.name for p in EXAMPLES.glob("*.py")} == set(re.findall(r"`([a-z_]+\.py)`", readme))


def test_the_torchtitan_example_says_what_it_needs(tmp_path):
    """torchtitan trains on a GPU only (examples/torchtitan_trainer.py says why), so on the CPU its
    example is only asked for its usage; tests/agent/test_integrations_torchtitan.py runs the same
    Trainer on the CPU with its attention kernel replaced."""
    out = run(tmp_path, sys.executable, str(EXAMPLES / "torchtitan_trainer.py"), "--help")
    assert "--server" in out and "packscope[torchtitan]" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA GPU is here: the example would train")
def test_the_torchtitan_example_without_a_gpu_says_it_needs_one(tmp_path):
    command = [sys.executable, str(EXAMPLES / "torchtitan_trainer.py"), "--server", "http://127.0.0.1:9"]
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=clean_env(), cwd=tmp_path)
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert "needs a CUDA GPU, and this machine has none" in done.stderr
