"""End to end, with real components only: the reference trainer (or the agent under a small real
torch workload) sends to the real backend under uvicorn on loopback, over a real SQLite file, and
everything is checked through the HTTP read API."""

from __future__ import annotations

import functools
import operator
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import torch

from packscope.agent import Agent, AgentConfig
from packscope.agent.sender import Sender
from packscope.core.flops import ModelSpec
from packscope.trainer.config import PRESETS, TrainConfig
from packscope.trainer.data import DocumentStream, step_documents
from packscope.trainer.train import run_training

if TYPE_CHECKING:
    from .conftest import Backend

INT_COLUMNS = (
    "interval",
    "rank",
    "first_step",
    "last_step",
    "steps",
    "gpus",
    "tokens",
    "real_tokens",
    "packs",
    "documents",
    "seqlen_sq_sum_bshd",
    "seqlen_sq_sum_thd",
)
FLOAT_COLUMNS = (
    "gpu_time_s",
    "flops_bshd",
    "flops_thd",
    "flops_useful",
    "tflops_bshd",
    "tflops_thd",
    "tflops_useful",
    "overcount_pct",
)


def parse(rows: list[dict[str, str]]) -> list[dict[str, Any]]:
    out = []
    for row in rows:
        parsed: dict[str, Any] = {k: int(row[k]) for k in INT_COLUMNS}
        parsed.update({k: float(row[k]) for k in FLOAT_COLUMNS})
        out.append(parsed)
    return out


def wait_until(condition: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


# -- 1. the reference trainer against the real backend ----------------------------------------------
def train_config(layout: str, server: str) -> TrainConfig:
    return TrainConfig(
        preset="tiny",
        layout=layout,
        steps=20,
        log_every=5,
        pack_length=256,
        packs_per_step=2,
        server=server,
        progress=False,
        device="cpu",
        name=f"e2e-{layout}",
    )


def documents_per_interval(cfg: TrainConfig) -> list[list[int]]:
    """Each interval's document lengths, rebuilt from the trainer's data pipeline alone (the stream
    is seeded and its grouping into steps does not depend on the layout), not from the agent."""
    stream = DocumentStream(cfg.data, cfg.model.vocab, cfg.pack_length, cfg.seed)
    steps = step_documents(
        iter(stream),
        cfg.micro_batches,
        cfg.packs_per_micro_batch,
        cfg.pack_length,
        cfg.max_docs_per_pack,
        cfg.align,
    )
    per_step = [[len(doc) for group in next(steps) for doc in group] for _ in range(cfg.steps)]
    n = cfg.log_every
    return [functools.reduce(operator.iadd, per_step[i : i + n], []) for i in range(0, cfg.steps, n)]


def check_run(backend: Backend, cfg: TrainConfig, summary: dict[str, Any], spec: ModelSpec) -> list[dict[str, Any]]:
    """Everything the server says about one finished reference-trainer run; returns its CSV rows."""
    run_id = summary["run_id"]
    run = backend.get(f"/api/v1/runs/{run_id}")
    assert run["status"] == "finished" and run["ended_at"] is not None
    assert run["name"] == cfg.run_name and run["layout"] == cfg.layout
    assert run["records"] == 4 and run["last_step"] == 20
    assert run["model"] == spec.to_dict()
    assert (run["c_lin"], run["c_core"]) == (spec.c_lin, spec.c_core)

    raw = backend.csv_rows(run_id)
    assert len(raw) == 4
    rows = parse(raw)
    assert [r["interval"] for r in rows] == [0, 1, 2, 3]
    assert [(r["first_step"], r["last_step"], r["steps"]) for r in rows] == [
        (1, 5, 5),
        (6, 10, 5),
        (11, 15, 5),
        (16, 20, 5),
    ]
    covered = sorted(s for r in rows for s in range(r["first_step"], r["last_step"] + 1))
    assert covered == list(range(1, 21))  # every step exactly once

    # The raw sums equal what the data pipeline fed the model, rebuilt here independently.
    L = cfg.pack_length
    for r, docs in zip(rows, documents_per_interval(cfg), strict=True):
        packs = cfg.packs_per_step * cfg.log_every if cfg.layout == "thd" else len(docs)
        assert r["gpus"] == 1 and r["rank"] == 0
        assert r["documents"] == len(docs), r
        assert r["real_tokens"] == sum(docs), r
        assert r["seqlen_sq_sum_thd"] == sum(d * d for d in docs), r
        assert r["packs"] == packs, r
        assert r["tokens"] == packs * L, r
        assert r["seqlen_sq_sum_bshd"] == packs * L * L, r
    assert sum(r["real_tokens"] for r in rows) == summary["real_tokens"]
    assert sum(r["tokens"] for r in rows) == summary["token_slots"]

    # FLOPs and rates recomputed from the stored raw sums with the preset's own ModelSpec.
    for r in rows:
        want = {
            "bshd": spec.flops(r["tokens"], r["seqlen_sq_sum_bshd"]),
            "thd": spec.flops(r["tokens"], r["seqlen_sq_sum_thd"]),
            "useful": spec.flops(r["real_tokens"], r["seqlen_sq_sum_thd"]),
        }
        assert want["bshd"] >= want["thd"] >= want["useful"] > 0
        assert r["gpu_time_s"] > 0
        for kind, flops in want.items():
            assert r[f"flops_{kind}"] == pytest.approx(flops, rel=1e-12), kind  # what the agent sent
            tflops = flops / r["gpu_time_s"] / r["gpus"] / 1e12
            assert r[f"tflops_{kind}"] == pytest.approx(tflops, rel=1e-9), kind  # what the server derived
        assert r["overcount_pct"] == pytest.approx(100 * (want["bshd"] / want["thd"] - 1), rel=1e-9, abs=1e-12)

    series = backend.get(f"/api/v1/runs/{run_id}/series", max_points=500)
    assert series["points"] == 4
    cols = series["columns"]
    assert cols["step"] == [5, 10, 15, 20] and cols["first_step"] == [1, 6, 11, 16]
    for i, r in enumerate(rows):
        for kind in ("bshd", "thd", "useful"):
            assert cols[f"tflops_{kind}"][i] == pytest.approx(r[f"tflops_{kind}"], rel=1e-9)

    totals = run["totals"]
    gpu_seconds = sum(r["gpu_time_s"] * r["gpus"] for r in rows)
    assert totals["steps"] == 20
    for kind in ("bshd", "thd", "useful"):
        flops = sum(r[f"flops_{kind}"] for r in rows)
        assert totals[f"flops_{kind}"] == pytest.approx(flops, rel=1e-9)
        assert totals[f"tflops_{kind}"] == pytest.approx(flops / gpu_seconds / 1e12, rel=1e-9)
    return rows


def test_cpu_training_run_end_to_end(backend: Backend):
    spec = PRESETS["tiny"].to_model_spec()

    thd_cfg = train_config("thd", backend.url)
    thd = run_training(thd_cfg)
    thd_rows = check_run(backend, thd_cfg, thd, spec)
    assert all(r["overcount_pct"] > 0 for r in thd_rows)  # packs of several documents: BSHD over-counts
    assert backend.get(f"/api/v1/runs/{thd['run_id']}")["totals"]["overcount_pct"] > 0

    bshd_cfg = train_config("bshd", backend.url)
    bshd = run_training(bshd_cfg)
    bshd_rows = check_run(backend, bshd_cfg, bshd, spec)
    # Same seed, same documents: only the layout (and so the padding) differs.
    for t, b in zip(thd_rows, bshd_rows, strict=True):
        for key in ("documents", "real_tokens", "seqlen_sq_sum_thd", "flops_useful"):
            assert t[key] == b[key], key

    listed = backend.get("/api/v1/runs")["runs"]
    ids = [r["run_id"] for r in listed]
    assert ids == [bshd["run_id"], thd["run_id"]]  # newest first
    assert [r["status"] for r in listed] == ["finished", "finished"]
    assert [r["layout"] for r in listed] == ["bshd", "thd"]

    for order in ([thd["run_id"], bshd["run_id"]], [bshd["run_id"], thd["run_id"]]):
        compared = backend.get("/api/v1/compare", run_id=order)["runs"]
        assert [r["run_id"] for r in compared] == order  # in the order asked
        assert all(r["records"] == 4 and r["totals"]["steps"] == 20 for r in compared)


# -- the agent under a small real workload ----------------------------------------------------------
SMALL_MODEL = ModelSpec(layers=2, hidden=64, heads=4, ffn=128, vocab=256)
PACK = 256
# Two packs of 256 slots; the second ends in 20 slots of padding.
CU_SEQLENS = torch.tensor([0, 100, 256, 256 + 180, 256 + 236], dtype=torch.int32)


class Workload:
    """A few small matmuls per step on the CPU, with the agent wired in as a trainer would."""

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        gen = torch.Generator().manual_seed(0)
        self.x = torch.randn(64, 128, generator=gen)
        self.w = torch.randn(128, 128, generator=gen) / 128**0.5
        self.step_times: list[float] = []

    def run(self, steps: int) -> list[float]:
        times = []
        for _ in range(steps):
            start = time.perf_counter()
            self.agent.step_begin()
            self.agent.observe_batch(cu_seqlens=CU_SEQLENS, shape=(2, PACK))
            y = self.x
            for _ in range(4):
                y = torch.tanh(y @ self.w)
            self.agent.step_end(loss=y.square().mean(), lr=1e-3)
            times.append(time.perf_counter() - start)
        return times


def spooled(agent: Agent) -> list[int]:
    assert agent.sender is not None
    return [r["interval"] for r in agent.sender.spool.peek(10_000)]


def sending_agent(server: str, run_name: str, **config: Any) -> tuple[Agent, Sender]:
    """A CPU agent that logs every step and retries fast, so outage tests stay short."""
    agent = Agent(
        AgentConfig(server=server, run_name=run_name, log_every=1, request_timeout_s=0.5, **config),
        model=SMALL_MODEL,
        device="cpu",
    )
    assert agent.sender is not None
    agent.sender.retry_s = 0.1
    return agent, agent.sender


@pytest.mark.alone  # compares step times taken one after the other
def test_server_killed_mid_run_every_interval_stored_exactly_once(backend: Backend, tmp_path: Path):
    agent, sender = sending_agent(backend.url, "e2e-outage", spool_dir=str(tmp_path / "spool"))
    work = Workload(agent)

    up = work.run(20)
    # Let the sender deliver the first 20 records, so that the outage below is what spools.
    wait_until(lambda: sender.sent == 20, 15, "the first 20 records to be stored")
    assert len(sender.spool) == 0
    assert backend.get(f"/api/v1/runs/{agent.run_id}")["records"] == 20

    backend.stop()
    down = work.run(20)
    # Every record made while the server is down waits on disk, in order.
    wait_until(lambda: len(sender.spool) == 20, 15, "the outage's records to be spooled")
    assert sender.spool.path.stat().st_size > 0
    assert spooled(agent) == list(range(20, 40))
    assert sender.last_error is not None
    # The training loop never waited for the sender: steps while down are not slowed.
    assert statistics.median(down) < 2 * statistics.median(up) + 0.005, (up, down)

    backend.start()  # a new server on the same port and the same SQLite file
    work.run(20)
    assert agent.close(timeout_s=30) is True
    assert len(sender.spool) == 0
    assert sender.sent == 60  # the server inserted 60 rows over the whole run

    rows = parse(backend.csv_rows(agent.run_id))
    assert sorted(r["interval"] for r in rows) == list(range(60))  # each interval exactly once
    assert [(r["first_step"], r["last_step"]) for r in rows] == [(i + 1, i + 1) for i in range(60)]
    assert all(r["tokens"] == 2 * PACK and r["real_tokens"] == 236 + 256 for r in rows)
    run = backend.get(f"/api/v1/runs/{agent.run_id}")
    assert run["status"] == "finished" and run["records"] == 60 and run["last_step"] == 60
