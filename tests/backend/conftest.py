"""Fixtures for the backend tests: an app over a temporary SQLite or PostgreSQL database, and
wire records with realistic, varied numbers."""

import os
import random
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from fastapi.testclient import TestClient

from packscope.backend.http.settings import Settings
from packscope.backend.server.app import create_app
from packscope.core.flops import ModelSpec

PG_ADMIN = "host=127.0.0.1 port=5432 user=postgres dbname=postgres"

MODEL = {
    "layers": 4,
    "hidden": 256,
    "heads": 8,
    "kv_heads": 2,
    "head_dim": 32,
    "ffn": 688,
    "gated": True,
    "vocab": 32000,
    "vocab_divisor": 128,
    "tp": 1,
}


def run_body(run_id: str = "run-1", **overrides: Any) -> dict[str, Any]:
    body = {
        "run_id": run_id,
        "name": "demo",
        "project": "tests",
        "tags": ["cpu"],
        "config": {"lr": 3e-4},
        "model": dict(MODEL),
        "hardware": {"gpu_name": "NVIDIA H200", "gpu_count": 8, "peak_tflops": 989.0},
        "parallel": {"dp": 8, "tp": 1, "pp": 1, "cp": 1, "ep": 1},
        "layout": "thd",
        "started_at": "2026-11-29T09:00:00Z",
    }
    body.update(overrides)
    return body


def make_record(interval: int, rng: random.Random, *, steps: int = 10, gpus: int = 8, rank: int = 0) -> dict[str, Any]:
    """A plausible interval record; numbers vary so that bucket sums differ from bucket means. One
    interval in three has its syncs uncounted, as an agent that samples sync counting sends it."""
    pack_len = 4096
    packs = steps * gpus * rng.randint(2, 4)
    tokens = packs * pack_len
    docs = [rng.randint(16, 2048) for _ in range(rng.randint(packs, 3 * packs))]
    real = min(sum(docs), tokens - rng.randint(0, packs))
    doc_counts = [0] * 24
    doc_tokens = [0] * 24
    for d in docs:
        doc_counts[d.bit_length() - 1] += 1
        doc_tokens[d.bit_length() - 1] += d
    gpu_time = steps * rng.uniform(0.05, 0.5)
    syncs = rng.randint(0, 5 * steps)
    return {
        "interval": interval,
        "rank": rank,
        "first_step": interval * steps + 1,
        "last_step": (interval + 1) * steps,
        "steps": steps,
        "gpus": gpus,
        "wall_start": 1764406800.0 + interval,
        "wall_end": 1764406800.0 + interval + gpu_time,
        "gpu_time_s": gpu_time,
        "host_time_s": gpu_time * 1.01,
        "step_time_p50_s": gpu_time / steps,
        "step_time_p90_s": gpu_time / steps * 1.1,
        "step_time_max_s": gpu_time / steps * 1.3,
        "timing_lag_steps": 2,
        "tokens": tokens,
        "real_tokens": real,
        "packs": packs,
        "documents": len(docs),
        "seqlen_sq_sum_bshd": packs * pack_len * pack_len,
        "seqlen_sq_sum_thd": sum(d * d for d in docs),
        "flops_bshd": 1.0,
        "flops_thd": 1.0,
        "flops_useful": 1.0,  # the server must not use these
        "syncs": {
            "total": syncs,
            "sites": [
                {"site": "train.py:88", "count": syncs // 2},
                {"site": "model.py:12", "count": syncs - syncs // 2},
            ],
        }
        if interval % 3 != 2
        else {"total": 0, "uncounted_steps": steps, "sites": []},
        "histograms": {
            "documents": {"count": doc_counts, "tokens": doc_tokens},
            "packs": {"count": [0] * 12 + [packs] + [0] * 11, "tokens": [0] * 12 + [real] + [0] * 11},
        },
        "loss": rng.uniform(1.5, 3.0),
        "lr": 3e-4,
        "grad_norm": rng.uniform(0.5, 1.5),
    }


@pytest.fixture
def new_run() -> Callable[..., dict[str, Any]]:
    """new_run(run_id="run-1", **overrides) -> a POST /api/v1/runs body."""
    return run_body


@pytest.fixture
def spec() -> ModelSpec:
    """The FLOPs model of every test run, for computing expectations independently of the server."""
    return ModelSpec.from_dict(dict(MODEL))


@pytest.fixture
def records() -> Callable[..., list[dict[str, Any]]]:
    """records(n, start=0, seed=0) -> n consecutive interval records."""

    def build(n: int, start: int = 0, seed: int = 0, **kwargs: Any) -> list[dict[str, Any]]:
        rng = random.Random(seed)
        return [make_record(i, rng, **kwargs) for i in range(start, start + n)]

    return build


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'packscope.db'}"


@pytest.fixture
def postgres() -> Iterator[str]:
    """A fresh, uniquely named PostgreSQL database on 127.0.0.1:5432 (dropped afterwards)."""
    name = f"packscope_test_{uuid.uuid4().hex[:12]}"
    try:
        admin = psycopg.connect(PG_ADMIN, autocommit=True, connect_timeout=3)
    except psycopg.OperationalError as exc:
        if os.environ.get("CI"):
            raise
        pytest.skip(f"PostgreSQL is not reachable on 127.0.0.1:5432 ({exc}); start it or deselect -m postgres")
    with admin:
        admin.execute(f'CREATE DATABASE "{name}"')
        try:
            yield f"postgresql+psycopg://postgres@127.0.0.1:5432/{name}"
        finally:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def database_url(request: pytest.FixtureRequest) -> str:
    """Runs a test on SQLite and again on PostgreSQL."""
    if request.param == "sqlite":
        return request.getfixturevalue("sqlite_url")
    return request.getfixturevalue("postgres")


@pytest.fixture
def make_client(sqlite_url: str) -> Iterator[Callable[..., TestClient]]:
    """make_client(database_url=None, **settings) -> a started TestClient over a migrated database."""
    clients: list[TestClient] = []

    def build(database_url: str | None = None, **settings: Any) -> TestClient:
        # Explicit tokens, so PACKSCOPE_* variables of the machine running the tests do not leak in.
        settings = {"ingest_token": None, "read_token": None, **settings}
        app = create_app(Settings(database_url=database_url or sqlite_url, **settings))
        client = TestClient(app)
        client.__enter__()
        clients.append(client)
        return client

    yield build
    for client in clients:
        client.__exit__(None, None, None)


@pytest.fixture
def client(make_client: Callable[..., TestClient]) -> TestClient:
    return make_client()


@pytest.fixture
def run(client: TestClient) -> dict[str, Any]:
    """A stored run (run-1) on `client`."""
    response = client.post("/api/v1/runs", json=run_body())
    assert response.status_code == 201, response.text
    return response.json()


def _ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def _uncounted(recs: list[dict[str, Any]]) -> int:
    return sum(r["syncs"].get("uncounted_steps", 0) for r in recs)


def _oracle(recs: list[dict[str, Any]], spec: ModelSpec, peak: float | None = 989.0) -> dict[str, Any]:
    """The documented formulas, written out again from the raw wire fields with exact integers."""
    gpus = {r["gpus"] for r in recs}
    assert len(gpus) == 1, "the oracle assumes one GPU count per window"
    (g,) = gpus

    def fl(tokens: int, s2: int) -> int:
        return tokens * spec.c_lin + s2 * spec.c_core

    def tflops(r: dict[str, Any], kind: str) -> float:
        tokens = r["real_tokens"] if kind == "useful" else r["tokens"]
        s2 = r["seqlen_sq_sum_bshd"] if kind == "bshd" else r["seqlen_sq_sum_thd"]
        return fl(tokens, s2) / r["gpu_time_s"] / g / 1e12

    time = sum(r["gpu_time_s"] for r in recs)
    rank_steps = sum(r["steps"] for r in recs)  # every rank's steps: what per-rank means divide by
    steps = sum(r["steps"] for r in recs if r["rank"] == 0)  # each optimizer step once
    tokens = sum(r["tokens"] for r in recs)
    real = sum(r["real_tokens"] for r in recs)
    flops = {
        "bshd": sum(fl(r["tokens"], r["seqlen_sq_sum_bshd"]) for r in recs),
        "thd": sum(fl(r["tokens"], r["seqlen_sq_sum_thd"]) for r in recs),
        "useful": sum(fl(r["real_tokens"], r["seqlen_sq_sum_thd"]) for r in recs),
    }
    out: dict[str, Any] = {
        "steps": steps,
        "gpu_time_s": time,
        "tokens": tokens,
        "real_tokens": real,
        "documents": sum(r["documents"] for r in recs),
        "packs": sum(r["packs"] for r in recs),
        "overcount_pct": 100 * (flops["bshd"] / flops["thd"] - 1),
        "step_time_s": time / rank_steps,
        "step_time_p50_s": sum(r["step_time_p50_s"] * r["steps"] for r in recs) / rank_steps,
        "step_time_p90_s": sum(r["step_time_p90_s"] * r["steps"] for r in recs) / rank_steps,
        "attention_share_pct": 100 * sum(r["seqlen_sq_sum_thd"] for r in recs) * spec.c_core / flops["thd"],
        "step_time_s_min": min(r["gpu_time_s"] / r["steps"] for r in recs),
        "step_time_s_max": max(r["gpu_time_s"] / r["steps"] for r in recs),
        "tokens_per_gpu_s": tokens / time / g,
        "padding_pct": 100 * (1 - real / tokens),
        # Over the steps whose syncs were counted.
        "syncs_per_iter": _ratio(sum(r["syncs"]["total"] for r in recs), rank_steps - _uncounted(recs)),
        "loss": sum(r["loss"] * r["real_tokens"] for r in recs) / real,
    }
    for kind, f in flops.items():
        out[f"flops_{kind}"] = float(f)
        out[f"tflops_{kind}"] = f / time / g / 1e12
        out[f"tflops_{kind}_min"] = min(tflops(r, kind) for r in recs)
        out[f"tflops_{kind}_max"] = max(tflops(r, kind) for r in recs)
        out[f"mfu_{kind}"] = out[f"tflops_{kind}"] / peak if peak else None
    return out


@pytest.fixture
def oracle(spec: ModelSpec) -> Callable[..., dict[str, Any]]:
    """oracle(records, peak=989.0) -> the expected metrics of one window, computed independently."""
    return lambda recs, peak=989.0: _oracle(recs, spec, peak)


def assert_close(got: dict[str, Any], want: dict[str, Any], keys: list[str] | None = None) -> None:
    for key in keys or list(want):
        if want[key] is None:
            assert got[key] is None, key
        else:
            assert got[key] == pytest.approx(want[key], rel=1e-9), key


@pytest.fixture
def close() -> Callable[..., None]:
    """close(got, want, keys=None): every key equal to 1e-9 relative."""
    return assert_close
