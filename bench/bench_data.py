"""What the backend benchmarks share: a plausible wire record, a run body, and a scratch database.

Imports nothing of the backend (only packscope.core, whose histogram edges every version has), so a
benchmark that times another checkout's backend (`--packscope DIR`, `--server-pythonpath DIR`) can
use it after pointing its imports there.
"""

from __future__ import annotations

import random
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from packscope.core.histograms import NUM_BUCKETS

PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"
MODEL = {
    "layers": 24,
    "hidden": 2048,
    "heads": 16,
    "kv_heads": 4,
    "head_dim": 128,
    "ffn": 5504,
    "gated": True,
    "vocab": 32000,
    "vocab_divisor": 128,
    "tp": 1,
}


def run_body(run_id: str) -> dict[str, Any]:
    return {
        "run_id": run_id,
        "model": MODEL,
        "layout": "thd",
        "hardware": {"gpu_name": "NVIDIA H200", "gpu_count": 8, "peak_tflops": 989.0},
    }


@contextmanager
def scratch_database(database: str) -> Iterator[str]:
    """The URL of an empty database for one benchmark, removed afterwards: a SQLite file in a
    temporary folder, or a PostgreSQL database on 127.0.0.1:5432 (PG_ADMIN) dropped even if in use."""
    if database == "sqlite":
        with tempfile.TemporaryDirectory() as tmp:
            yield f"sqlite:///{tmp}/bench.db"
        return
    import psycopg

    name = f"packscope_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(PG_ADMIN, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def record(interval: int, rank: int, rng: random.Random) -> dict[str, Any]:
    """A wire record with plausible, varied numbers."""
    steps, gpus, packs = 10, 1, 40
    tokens = packs * 8192
    real = tokens - rng.randint(0, 4000)
    gpu_time = steps * rng.uniform(0.3, 0.5)
    docs = rng.randint(200, 400)
    return {
        "interval": interval,
        "rank": rank,
        "first_step": interval * steps + 1,
        "last_step": (interval + 1) * steps,
        "steps": steps,
        "gpus": gpus,
        "wall_start": 1.7e9 + interval,
        "wall_end": 1.7e9 + interval + gpu_time,
        "gpu_time_s": gpu_time,
        "host_time_s": gpu_time * 1.01,
        "step_time_p50_s": gpu_time / steps,
        "step_time_p90_s": gpu_time / steps,
        "step_time_max_s": gpu_time / steps,
        "timing_lag_steps": 1,
        "tokens": tokens,
        "real_tokens": real,
        "packs": packs,
        "documents": docs,
        "seqlen_sq_sum_bshd": packs * 8192 * 8192,
        "seqlen_sq_sum_thd": docs * 900 * 900,
        "flops_bshd": 1.0,
        "flops_thd": 1.0,
        "flops_useful": 1.0,
        "loss": rng.uniform(2, 3),
        "lr": 3e-4,
        "grad_norm": 1.0,
        "gpu": {"util_pct": 95.0, "power_w": 600.0, "energy_j": 600.0 * gpu_time},
        "syncs": {
            "total": 20,
            "sites": [{"site": "train.py:88", "count": 10}, {"site": f"model.py:{interval % 7}", "count": 10}],
        },
        "histograms": {
            k: {
                "count": [rng.randint(0, 9) for _ in range(NUM_BUCKETS)],
                "tokens": [rng.randint(0, 9999) for _ in range(NUM_BUCKETS)],
            }
            for k in ("documents", "packs")
        },
    }
