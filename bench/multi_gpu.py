"""The reference trainer on 2 GPUs, DDP and FSDP2, with every rank's agent records checked.

For each layout this launches ``torchrun --nproc-per-node 2 -m packscope train --parallel X``
(no server: ``--records-dir`` writes each rank's records), then checks, from the records alone:

* every rank sent every interval, with gpus = 1 and its own step times;
* each rank's counts equal brute force over the documents that rank's seeded stream holds, so
  the totals over ranks (what the server sums) equal the single-rank sums of the same batches;
* zero host syncs caused by the agent (named after a trainer line that calls it), on every rank; the process's other
  syncs are reported per rank (exact with cupti-python, else PyTorch's sync debug mode).

Prints a JSON summary (per layout: step time per rank, syncs/iteration per rank, tokens) and
exits 1 if a check failed. Needs no server, fastapi or network.

    python bench/multi_gpu.py [--out DIR] [--preset 125m] [--steps 30]
"""

from __future__ import annotations

import argparse
import importlib.util
import inspect
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from sync_records import sync_sites, syncs_per_step

from packscope.agent.histograms import NUM_BUCKETS
from packscope.trainer import train as train_module
from packscope.trainer.config import TrainConfig
from packscope.trainer.data import DocumentStream, step_documents
from packscope.trainer.distributed import Parallel

COUNT_KEYS = ("tokens", "real_tokens", "packs", "documents", "seqlen_sq_sum_bshd", "seqlen_sq_sum_thd")


def agent_call_sites() -> set[str]:
    """``train.py:<line>`` of every call into the agent in the reference trainer."""
    lines = inspect.getsource(train_module).splitlines()
    return {f"train.py:{n}" for n, text in enumerate(lines, 1) if re.search(r"\bagent\.\w+\(", text)}


AGENT_CALL_SITES = agent_call_sites()


def train_args(args: argparse.Namespace) -> dict:
    return dict(
        preset=args.preset,
        layout="thd",
        device="cuda",
        dtype="bfloat16",
        steps=args.steps,
        log_every=args.log_every,
        pack_length=args.pack_length,
        packs_per_step=args.packs_per_step,
        micro_batches=2,
        seed=11,
    )


def launch(kind: str, args: argparse.Namespace, sync_backend: str, out: Path) -> float:
    flags = [f"--{k.replace('_', '-')}={v}" for k, v in train_args(args).items()]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={args.gpus}",
        "-m",
        "packscope",
        "train",
        f"--parallel={kind}",
        f"--sync-backend={sync_backend}",
        "--no-progress",
        f"--records-dir={out}",
        *flags,
    ]
    print("$", " ".join(cmd), file=sys.stderr)
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=args.timeout_s)
    (out / "torchrun.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise RuntimeError(
            f"{kind}: torchrun exited {done.returncode}; see {out / 'torchrun.log'}:\n{done.stderr[-3000:]}"
        )
    return time.perf_counter() - start


def brute_intervals(cfg: TrainConfig, rank: int, world: int) -> list[dict]:
    """Per-interval counts of rank `rank`'s documents, one document at a time."""
    seed = Parallel("ddp", rank=rank, world_size=world).data_seed(cfg.seed)
    docs = DocumentStream(cfg.data, cfg.model.vocab, cfg.pack_length, seed)
    steps = step_documents(
        iter(docs), cfg.micro_batches, cfg.packs_per_micro_batch, cfg.pack_length, cfg.max_docs_per_pack, cfg.align
    )
    out: list[dict[str, Any]] = []
    for _ in range(-(-cfg.steps // cfg.log_every)):
        c = dict.fromkeys(COUNT_KEYS, 0)
        hist = [0] * NUM_BUCKETS
        for _ in range(min(cfg.log_every, cfg.steps - len(out) * cfg.log_every)):
            for group in next(steps):
                c["packs"] += cfg.packs_per_micro_batch
                c["tokens"] += cfg.packs_per_micro_batch * cfg.pack_length
                c["seqlen_sq_sum_bshd"] += cfg.packs_per_micro_batch * cfg.pack_length**2
                for doc in group:
                    n = len(doc)
                    c["documents"] += 1
                    c["real_tokens"] += n
                    c["seqlen_sq_sum_thd"] += n * n
                    hist[min(n.bit_length() - 1, NUM_BUCKETS - 1)] += 1
        out.append({**c, "doc_hist": hist})
    return out


def check_layout(kind: str, cfg: TrainConfig, world: int, out: Path) -> tuple[dict, list[str]]:
    failures: list[str] = []
    per_rank = [[json.loads(line) for line in (out / f"rank{r}.jsonl").read_text().splitlines()] for r in range(world)]
    expected = [brute_intervals(cfg, r, world) for r in range(world)]
    summary: dict = {"ranks": {}}
    for rank, records in enumerate(per_rank):
        if [r["interval"] for r in records] != list(range(len(expected[rank]))):
            failures.append(f"{kind} rank {rank}: intervals {[r['interval'] for r in records]}")
        if any(r["rank"] != rank or r["gpus"] != 1 for r in records):
            failures.append(f"{kind} rank {rank}: a record with another rank or gpus != 1")
        for rec, exp in zip(records, expected[rank], strict=False):  # a missing interval is reported above
            got = {k: rec[k] for k in COUNT_KEYS}
            if got != {k: exp[k] for k in COUNT_KEYS} or rec["histograms"]["documents"]["count"] != exp["doc_hist"]:
                failures.append(f"{kind} rank {rank} interval {rec['interval']}: {got} != brute force {exp}")
        sites = sync_sites(records)
        # The counter sees the whole process and names the first frame outside torch and the agent:
        # a sync the agent caused is named after the trainer's line that called the agent.
        agent_sites = {site: n for site, n in sites.items() if site in AGENT_CALL_SITES}
        if agent_sites:
            failures.append(f"{kind} rank {rank}: host syncs caused by the agent: {agent_sites}")
        timed = records[1:] or records  # the first interval holds start-up (allocator, NCCL warm-up)
        summary["ranks"][rank] = {
            "step_time_s": sum(r["gpu_time_s"] for r in timed) / sum(r["steps"] for r in timed),
            "step_time_p50_s": statistics.median(r["step_time_p50_s"] for r in timed),
            "syncs_per_iter": syncs_per_step(records),  # the whole process's, trainer and NCCL included
            "agent_syncs": sum(agent_sites.values()),
            "sync_sites": sites,
            "tokens": sum(r["tokens"] for r in records),
            "real_tokens": sum(r["real_tokens"] for r in records),
        }
    totals = {k: sum(r[k] for recs in per_rank for r in recs) for k in COUNT_KEYS}
    reference = {k: sum(e[k] for exp in expected for e in exp) for k in COUNT_KEYS}
    if totals != reference:
        failures.append(f"{kind}: totals over ranks {totals} != single-rank sums {reference}")
    times = [v["step_time_s"] for v in summary["ranks"].values()]
    summary.update(
        totals=totals,
        totals_match_brute_force=totals == reference,
        spread_max_over_median=max(times) / statistics.median(times),
    )
    return summary, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=os.environ.get("OUT") or tempfile.mkdtemp(prefix="packscope-multi-gpu-"))
    parser.add_argument("--gpus", type=int, default=2)
    parser.add_argument("--layouts", default="ddp,fsdp2")
    parser.add_argument("--preset", default="125m")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--log-every", type=int, default=10)
    parser.add_argument("--pack-length", type=int, default=2048)
    parser.add_argument("--packs-per-step", type=int, default=8)
    parser.add_argument("--timeout-s", type=float, default=150.0, help="per layout")
    args = parser.parse_args()
    if torch.cuda.device_count() < args.gpus:
        print(f"multi_gpu: needs {args.gpus} CUDA GPUs, torch sees {torch.cuda.device_count()}", file=sys.stderr)
        return 2
    sync_backend = "cupti" if importlib.util.find_spec("cupti") else "debug-mode"
    cfg = TrainConfig(**train_args(args))
    report = {
        "device": torch.cuda.get_device_name(0),
        "gpus": args.gpus,
        "torch": torch.__version__,
        "sync_backend": sync_backend,
        "preset": args.preset,
        "steps": args.steps,
        "pack_length": args.pack_length,
        "packs_per_step_per_rank": args.packs_per_step,
        "layouts": {},
    }
    failures: list[str] = []
    for kind in args.layouts.split(","):
        out = Path(args.out, kind)
        out.mkdir(parents=True, exist_ok=True)
        try:
            wall = launch(kind, args, sync_backend, out)
        except (RuntimeError, subprocess.TimeoutExpired) as exc:
            failures.append(str(exc))
            continue
        summary, failed = check_layout(kind, cfg, args.gpus, out)
        report["layouts"][kind] = {"wall_s": wall, **summary}
        failures += failed
    report["failures"] = failures
    report["ok"] = not failures
    text = json.dumps(report, indent=2)
    Path(args.out, "multi_gpu.json").write_text(text)
    print(text)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
