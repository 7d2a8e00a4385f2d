"""Reference-trainer throughput on one GPU: both layouts on the same documents, two model sizes.

For each (preset, layout) the trainer runs ``--steps`` steps with the agent attached (no
server); the first interval is warm-up and is dropped. Figures come from the agent's own
records, i.e. from the numbers the dashboard would show: real tokens/s, baseline and
THD-corrected TFLOP/s per GPU, and MFU against the GPU's dense bf16 peak.

    python bench/trainer_throughput.py [--presets 125m,1b] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from datetime import UTC, datetime
from typing import Literal

import torch
from sync_records import syncs_per_step

from packscope.agent import Agent, AgentConfig
from packscope.trainer.config import TrainConfig
from packscope.trainer.train import Trainer, train_step


def measure(
    preset: str,
    layout: Literal["thd", "bshd"],
    steps: int,
    log_every: int,
    pack_length: int,
    packs: int,
    micro: int,
    compile: bool = False,
) -> dict:
    # torch.compile runs THD with static shapes (fixed cu_seqlens size, dummy tail): no recompiles.
    cfg = TrainConfig(
        preset=preset,
        layout=layout,
        pack_length=pack_length,
        packs_per_step=packs,
        micro_batches=micro,
        device="cuda",
        dtype="bfloat16",
        steps=steps,
        log_every=log_every,
        progress=False,
        compile=compile,
        static=compile,
    )
    trainer = Trainer(cfg)
    agent = Agent(AgentConfig(log_every=log_every, layout=layout), model=trainer.model_cfg.to_model_spec())
    for _ in range(steps):
        train_step(trainer, trainer.next_batches(), agent)
    agent.close()
    recs = list(agent.records)[1:]  # the first interval holds warm-up and allocation
    t = sum(r["gpu_time_s"] for r in recs)
    peak = agent.hardware["peak_tflops"]
    out = {
        "preset": preset,
        "layout": layout,
        "compiled": compile,
        "parameters": trainer.model.num_params(),
        "steps_measured": sum(r["steps"] for r in recs),
        "s_per_step": t / sum(r["steps"] for r in recs),
        "real_tokens_per_s": sum(r["real_tokens"] for r in recs) / t,
        "token_slots_per_s": sum(r["tokens"] for r in recs) / t,
        "padding_pct": 100 * (1 - sum(r["real_tokens"] for r in recs) / sum(r["tokens"] for r in recs)),
        "syncs_per_iter": syncs_per_step(recs),
        "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30,
    }
    for kind in ("bshd", "thd", "useful"):
        tf = sum(r[f"flops_{kind}"] for r in recs) / t / 1e12
        out[f"tflops_{kind}"] = tf
        out[f"mfu_{kind}"] = tf / peak if peak else None
    del trainer, agent
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="125m,1b")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--log-every", type=int, default=5)
    ap.add_argument("--pack-length", type=int, default=2048)
    ap.add_argument("--packs-per-step", type=int, default=8)
    ap.add_argument("--micro-batches", type=int, default=8)
    ap.add_argument("--layouts", default="thd,bshd")
    ap.add_argument("--compile", action="store_true", help="torch.compile (THD only, static shapes)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    if args.compile and "bshd" in args.layouts:
        ap.error("--compile measures THD only (BSHD row counts vary, so it would recompile); add --layouts thd")
    if not torch.cuda.is_available():
        print("trainer_throughput: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    for preset in args.presets.split(","):
        for layout in args.layouts.split(","):
            rows.append(
                measure(
                    preset,
                    layout,
                    args.steps,
                    args.log_every,
                    args.pack_length,
                    args.packs_per_step,
                    args.micro_batches,
                    args.compile,
                )
            )
            print(json.dumps(rows[-1]), file=sys.stderr, flush=True)
    result = {
        "bench": "trainer_throughput",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "tokens_per_step_budget": args.pack_length * args.packs_per_step,
        "results": rows,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    header = ("preset", "layout", "s/step", "real tok/s", "TF/s base", "TF/s THD", "MFU THD")
    print("\n{:<6} {:<7} {:>8} {:>11} {:>9} {:>9} {:>8}".format(*header), file=sys.stderr)
    for r in rows:
        mfu = f"{100 * r['mfu_thd']:.1f}%" if r["mfu_thd"] is not None else "-"
        print(
            f"{r['preset']:<6} {r['layout'] + ('+c' if r['compiled'] else ''):<7} {r['s_per_step']:>8.4f} "
            f"{r['real_tokens_per_s']:>11,.0f} {r['tflops_bshd']:>9.1f} {r['tflops_thd']:>9.1f} {mfu:>8}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
