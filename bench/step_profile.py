"""Where a training step's time goes: N steps of a preset under torch.profiler, the top ops by
device time (self time: what the op's own kernels took, children excluded) as JSON on stdout
and a short table on stderr. On the CPU it ranks by CPU self time instead.

    python bench/step_profile.py --preset 1b --pack-length 4096 --packs-per-step 4 [--compile]
        [--chunked-ce] [--cuda-graphs] [--steps 5] [--top 25] [--out profile.json]
"""

from __future__ import annotations

import argparse
import json
import sys

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from packscope.trainer.config import TrainConfig
from packscope.trainer.train import Trainer, train_step


def self_time_us(event, cuda: bool) -> float:
    """An averaged event's self time on the device (or CPU), in µs, across torch versions."""
    if not cuda:
        return event.self_cpu_time_total
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return getattr(event, name)
    return 0.0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="1b")
    ap.add_argument("--pack-length", type=int, default=4096)
    ap.add_argument("--packs-per-step", type=int, default=4)
    ap.add_argument("--micro-batches", type=int, default=1)
    ap.add_argument("--compile", action="store_true")
    ap.add_argument("--cuda-graphs", action="store_true")
    ap.add_argument("--chunked-ce", action="store_true")
    ap.add_argument("--fused-projections", action="store_true")
    ap.add_argument("--warmup", type=int, default=3, help="steps before profiling (allocation, compile, capture)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--device", default="auto")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    cfg = TrainConfig(
        preset=args.preset,
        pack_length=args.pack_length,
        packs_per_step=args.packs_per_step,
        micro_batches=args.micro_batches,
        compile=args.compile,
        static=args.compile or args.cuda_graphs,
        cuda_graphs=args.cuda_graphs,
        chunked_ce=args.chunked_ce,
        fused_projections=args.fused_projections,
        device=args.device,
        steps=args.warmup + args.steps,
        progress=False,
    )
    trainer = Trainer(cfg)
    cuda = trainer.device.type == "cuda"
    for _ in range(args.warmup):
        train_step(trainer, trainer.next_batches())
    batches = [trainer.next_batches() for _ in range(args.steps)]  # data off the profile
    if cuda:
        torch.cuda.synchronize()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for b in batches:
            train_step(trainer, b)
        if cuda:
            torch.cuda.synchronize()
    # Ops are host-side events, charged with the device time of the kernels they launch; the
    # kernels are listed apart, so that nothing is counted twice.
    events = prof.key_averages()
    host = [e for e in events if e.device_type == DeviceType.CPU]
    kernels = [e for e in events if e.device_type != DeviceType.CPU]
    total = sum(self_time_us(e, cuda) for e in host)

    def top(group):
        ranked = sorted(group, key=lambda e: -self_time_us(e, cuda))[: args.top]
        return [
            {
                "op": e.key,
                "calls": e.count,
                "self_ms_per_step": self_time_us(e, cuda) / 1e3 / args.steps,
                "share": self_time_us(e, cuda) / total if total else 0.0,
            }
            for e in ranked
        ]

    ops = top(host)
    result = {
        "bench": "step_profile",
        "preset": args.preset,
        "pack_length": args.pack_length,
        "packs_per_step": args.packs_per_step,
        "micro_batches": args.micro_batches,
        "compile": args.compile,
        "cuda_graphs": args.cuda_graphs,
        "chunked_ce": args.chunked_ce,
        "steps": args.steps,
        "clock": "device" if cuda else "cpu",
        "total_self_ms_per_step": total / 1e3 / args.steps,
        "device": torch.cuda.get_device_name() if cuda else "cpu",
        "torch": torch.__version__,
        "top_ops": ops,
        "top_kernels": top(kernels),
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(f"\n{result['clock']} self time per step: {result['total_self_ms_per_step']:.1f} ms", file=sys.stderr)
    print(f"{'ms/step':>8} {'share':>6} {'calls':>6}  op", file=sys.stderr)
    for o in ops[:15]:
        print(f"{o['self_ms_per_step']:>8.2f} {o['share']:>6.1%} {o['calls']:>6}  {o['op'][:90]}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
