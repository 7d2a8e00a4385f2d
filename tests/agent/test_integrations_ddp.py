"""The HF Trainer and Lightning callbacks with two processes (torchrun, gloo on CPU) against a
live backend: both ranks' records are stored, each rank's rows equal a brute-force count over the
micro-batches its collator built, and the run's totals are their sums."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

WORKERS = Path(__file__).with_name("ddp_workers.py")
STEPS, LOG_EVERY = 4, 2
KEYS = ("tokens", "packs", "real_tokens", "documents", "seqlen_sq_sum_bshd", "seqlen_sq_sum_thd")

pytestmark = [
    pytest.mark.slow,  # two fresh interpreters import torch and the training library: 30-60 s here
    pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo"),
]


def brute(batches: list) -> dict:
    docs = [d for rows, _ in batches for row in rows for d in row]
    return {
        "tokens": sum(len(rows) * n for rows, n in batches),
        "packs": sum(len(rows) for rows, _ in batches),
        "real_tokens": sum(docs),
        "documents": len(docs),
        "seqlen_sq_sum_bshd": sum(len(rows) * n * n for rows, n in batches),
        "seqlen_sq_sum_thd": sum(d * d for d in docs),
    }


def torchrun(kind: str, url: str, out: Path) -> None:
    from tests.e2e.conftest import free_port

    env = {k: v for k, v in os.environ.items() if not k.startswith("PACKSCOPE_")}
    env.update(OMP_NUM_THREADS="1", HOME=str(out / "home"), PYTHONPATH=str(Path(__file__).parents[2]))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    command += ["--master-port", str(free_port())]
    done = subprocess.run(
        [*command, str(WORKERS), kind, url, str(out)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-5000:]


@pytest.mark.parametrize("kind", ["hf", "lightning"])
def test_two_processes_each_rank_stored_and_equal_to_brute_force(kind, tmp_path):
    from tests.e2e.conftest import Backend, free_port

    for library in {"hf": ("transformers", "datasets"), "lightning": ("lightning",)}[kind]:
        pytest.importorskip(library, reason=f"the {kind} workers need packscope[{kind}]")

    backend = Backend(f"sqlite:///{tmp_path / 'ddp.db'}", free_port()).start()
    try:
        torchrun(kind, backend.url, tmp_path)
        ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
        run_id = ranks[0]["run_id"]
        assert ranks[1]["run_id"] == run_id  # rank 0's id, broadcast
        accumulation = len(ranks[0]["batches"]) // STEPS
        rows = backend.csv_rows(run_id)
        assert sorted((int(r["rank"]), int(r["interval"])) for r in rows) == [(0, 0), (0, 1), (1, 0), (1, 1)]
        for rank, truth in enumerate(ranks):
            mine = sorted((r for r in rows if int(r["rank"]) == rank), key=lambda r: int(r["interval"]))
            per_interval = LOG_EVERY * accumulation
            for i, row in enumerate(mine):
                expected = brute(truth["batches"][i * per_interval : (i + 1) * per_interval])
                assert {k: int(row[k]) for k in KEYS} == expected, (rank, i)
        assert ranks[0]["batches"] != ranks[1]["batches"]  # the sampler split the data
        summary = backend.get(f"/api/v1/runs/{run_id}")
        everything = ranks[0]["batches"] + ranks[1]["batches"]
        for key in ("tokens", "packs", "real_tokens", "documents"):
            assert summary["totals"][key] == brute(everything)[key], key
        assert summary["status"] == "finished" and summary["records"] == 4
    finally:
        backend.stop()
