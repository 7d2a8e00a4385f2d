"""What the agent costs: step time with the agent off and on, alternating in one run.

On CUDA: the reference trainer (125m preset, one 8192-token THD pack per step, bf16 autocast,
varlen attention, fused AdamW) runs blocks of steps with the agent off and on, alternating the
order every round, each step timed with its own CUDA events. The result is the ratio of median
step times on/off (target <= 1.005). Everywhere: the agent's host (CPU) cost per step in
microseconds, measured around the agent calls alone, split into ordinary and log-boundary steps.

    python bench/agent_overhead.py [--rounds 6 --block 25] [--out results.json]

Prints one JSON object, then a short table.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from datetime import datetime, timezone

import torch

from packscope.agent import Agent, AgentConfig
from packscope.trainer.config import PRESETS, TrainConfig
from packscope.trainer.train import Trainer, observe


def host_cost_us(device: torch.device, steps: int = 2000, log_every: int = 10) -> dict:
    """Microseconds of host time inside the agent's calls, per step, with a realistic THD batch."""
    g = torch.Generator().manual_seed(1)
    cu = [0]
    for p in range(8):  # 8 packs of 8192 slots, documents of 16..2048 tokens
        end = (p + 1) * 8192
        while cu[-1] < end:
            cu.append(min(end, cu[-1] + int(torch.randint(16, 2048, (1,), generator=g))))
    cu_t = torch.tensor(cu, dtype=torch.int32).to(device)
    loss = torch.zeros((), device=device)
    agent = Agent(AgentConfig(log_every=log_every, count_syncs=False, sample_gpu=False), model=PRESETS["125m"].to_model_spec(), device=device)
    plain, boundary = [], []
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        agent.step_begin()
        agent.observe_batch(cu_seqlens=cu_t, shape=(8, 8192))
        agent.step_end(loss=loss)
        dt = (time.perf_counter() - t0) * 1e6
        (boundary if step % log_every == 0 else plain).append(dt)
    agent.close()
    return {
        "device": device.type, "documents_per_step": len(cu) - 1, "log_every": log_every,
        "plain_step_us_median": statistics.median(plain), "log_step_us_median": statistics.median(boundary),
        "mean_us_per_step": (sum(plain) + sum(boundary)) / steps,
    }


def step_time_ratio(rounds: int, block: int, warmup: int) -> dict:
    cfg = TrainConfig(preset="125m", layout="thd", pack_length=8192, packs_per_step=1, device="cuda",
                      dtype="bfloat16", progress=False, steps=10**6, log_every=10)
    trainer = Trainer(cfg)
    pool = [trainer.next_batches() for _ in range(32)]  # fixed data on the device: no host noise
    agent = Agent(AgentConfig(log_every=cfg.log_every, sample_gpu=True), model=trainer.model_cfg.to_model_spec())

    def run(n: int, with_agent: bool, times: list[float] | None) -> None:
        events = []
        for i in range(n):
            batches = pool[(trainer.step + i) % len(pool)]
            labels = sum(b.label_tokens for b in batches)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            if with_agent:
                agent.step_begin()
            loss = torch.zeros((), device=trainer.device)
            for b in batches:
                if with_agent:
                    observe(agent, b)
                loss += trainer.forward_backward(b, labels)
            lr, grad_norm = trainer.optimizer_step()
            if with_agent:
                agent.step_end(loss=loss, lr=lr, grad_norm=grad_norm)
            end.record()
            events.append((start, end))
        torch.cuda.synchronize()  # block boundary only, the same for both modes
        if times is not None:
            times += [s.elapsed_time(e) / 1e3 for s, e in events]

    run(warmup, True, None)
    run(warmup, False, None)
    on, off, per_round = [], [], []
    for r in range(rounds):
        order = (False, True) if r % 2 == 0 else (True, False)
        got = {}
        for mode in order:
            if mode:
                agent.syncs.install()
            else:
                agent.syncs.uninstall()  # agent off means off: no sync debug mode either
            t: list[float] = []
            run(block, mode, t)
            got[mode] = t
        on += got[True]
        off += got[False]
        per_round.append(statistics.median(got[True]) / statistics.median(got[False]))
    agent.close()
    records = list(agent.records)
    syncs = sum(r["syncs"]["total"] for r in records)
    return {
        "model": "125m", "parameters": trainer.model.num_params(), "tokens_per_step": 8192,
        "rounds": rounds, "block": block,
        "median_step_s_off": statistics.median(off), "median_step_s_on": statistics.median(on),
        "ratio_on_off": statistics.median(on) / statistics.median(off),
        "ratio_per_round": per_round,
        "agent_reported_syncs_per_iter": syncs / max(1, sum(r["steps"] for r in records)),
        "agent_reported_thd_tflops": sum(r["flops_thd"] for r in records) / sum(r["gpu_time_s"] for r in records) / 1e12,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--block", type=int, default=25)
    ap.add_argument("--warmup", type=int, default=15)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    result = {
        "bench": "agent_overhead", "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "host_cost_cpu": host_cost_us(torch.device("cpu")),
    }
    if torch.cuda.is_available():
        result["host_cost_cuda"] = host_cost_us(torch.device("cuda"))
        result["step_time"] = step_time_ratio(args.rounds, args.block, args.warmup)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print("\nagent host cost per step (us, median): "
          f"cpu plain {result['host_cost_cpu']['plain_step_us_median']:.0f}, "
          f"cpu log step {result['host_cost_cpu']['log_step_us_median']:.0f}", file=sys.stderr)
    if "step_time" in result:
        st = result["step_time"]
        print(f"median step on/off: {st['median_step_s_on'] * 1e3:.2f} / {st['median_step_s_off'] * 1e3:.2f} ms "
              f"-> ratio {st['ratio_on_off']:.4f} (target <= 1.005)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
