"""What the agent costs: step time with the agent off and on, alternating in one run.

On CUDA: the reference trainer (125m preset, one 8192-token THD pack per step, bf16 autocast,
varlen attention, fused AdamW; eager, then torch.compile) runs with the agent off and on, the
modes taking turns in rounds (one step of each, shuffled, same batch), each step timed with its
own CUDA events. The result is the on/off step-time ratio (target <= 1.005) as the ratio of
medians, the median of per-round ratios and the ratio of means, each with a bootstrap 95%
interval, for the agent's core, plus its sync counter, plus NVML. Everywhere: the agent's host (CPU) cost per
step in microseconds, measured around the agent calls alone, split into ordinary and
log-boundary steps; on CUDA also what one event call costs the host. Host syncs the agent
reports are given for the steady state (intervals after the warm-up rounds) and, apart, for the
warm-up, where torch.compile's first steps synchronize.

    python bench/agent_overhead.py [--steps-per-mode 400] [--presets 125m,1b] [--builds eager,compiled] [--out FILE]

Prints one JSON object, then a short table.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import io
import json
import pstats
import random
import statistics
import sys
import time
from datetime import UTC, datetime
from typing import Any

import torch
from sync_records import sync_sites, syncs_per_step

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
    agent = Agent(
        AgentConfig(log_every=log_every, count_syncs=False, sample_gpu=False),
        model=PRESETS["125m"].to_model_spec(),
        device=device,
    )
    plain: list[float] = []
    boundary: list[float] = []
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        agent.step_begin()
        agent.observe_batch(cu_seqlens=cu_t, shape=(8, 8192))
        agent.step_end(loss=loss)
        dt = (time.perf_counter() - t0) * 1e6
        (boundary if step % log_every == 0 else plain).append(dt)
    agent.close()
    return {
        "device": device.type,
        "documents_per_step": len(cu) - 1,
        "log_every": log_every,
        "plain_step_us_median": statistics.median(plain),
        "log_step_us_median": statistics.median(boundary),
        "mean_us_per_step": (sum(plain) + sum(boundary)) / steps,
    }


def event_call_costs_us(n: int = 2000) -> dict:
    """Host microseconds per call of the CUDA event operations the step timer makes."""

    def per_call(fn) -> float:
        fn()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        return (time.perf_counter() - t0) / n * 1e6

    cuda_ev = torch.cuda.Event(enable_timing=True)
    generic = torch.Event(torch.device("cuda"), enable_timing=True)
    generic.record()
    torch.cuda.synchronize()
    return {
        "torch.cuda.Event.record": per_call(cuda_ev.record),
        "torch.Event.record": per_call(generic.record),
        "torch.cuda.current_stream": per_call(torch.cuda.current_stream),
        "torch.Event.query (complete)": per_call(generic.query),
        "torch.Event.elapsed_time": per_call(lambda: generic.elapsed_time(generic)),
        "time.perf_counter": per_call(time.perf_counter),
    }


def ratio_estimates(on: list[float], off: list[float], resamples: int = 2000) -> dict:
    """On/off step-time ratios with bootstrap 95% intervals; on[r] and off[r] ran in the same
    round, on the same batch, and whole rounds are resampled.

    ``of_medians`` is median(on) / median(off); ``paired`` is the median over rounds of
    on[r] / off[r], which cancels what the rounds do not share (the batch, the machine's drift)
    and so resolves smaller differences; ``of_means`` includes the log-boundary steps' cost.
    """
    g = torch.Generator().manual_seed(0)
    a, b = torch.tensor(on, dtype=torch.float64), torch.tensor(off, dtype=torch.float64)
    idx = torch.randint(len(a), (resamples, len(a)), generator=g)
    q = torch.tensor([0.025, 0.975], dtype=torch.float64)
    boot = {
        "of_medians": a[idx].quantile(0.5, dim=1) / b[idx].quantile(0.5, dim=1),
        "paired": (a / b)[idx].quantile(0.5, dim=1),
        "of_means": a[idx].mean(dim=1) / b[idx].mean(dim=1),
    }
    point = {
        "of_medians": a.quantile(0.5) / b.quantile(0.5),
        "paired": (a / b).quantile(0.5),
        "of_means": a.mean() / b.mean(),
    }
    return {k: {"ratio": float(point[k]), "ci95": boot[k].quantile(q).tolist()} for k in boot}


# Agent variants measured against "off" in the same run: the core alone, plus the debug-mode
# sync counter, plus NVML telemetry (the default configuration).
VARIANTS: dict[str, dict[str, Any]] = {
    "core": dict(count_syncs=False, sample_gpu=False),
    "core+syncs": dict(count_syncs=True, sample_gpu=False),
    "full": dict(count_syncs=True, sample_gpu=True),
}
# --cupti: the default configuration with the CUPTI sync counter and its activity trace of one
# step per counted interval (the ledger's sync and launch-bound prices, docs/ledger.md). CUPTI
# holds one subscription per process: this agent's counter stays installed for the whole run
# (the trainer is sync-free, so the other modes' steps give it nothing to count), and a trace of
# one step starts and stops inside this agent's own step.
CUPTI_VARIANT = {"full+cupti": dict(count_syncs=True, sample_gpu=True, sync_backend="cupti", trace_idle_steps=1)}


LEDGER_FIELDS = (
    "data_wait_s", "data_wait_gaps", "traced_steps", "traced_step_time_s", "sync_idle_s", "launch_idle_s",
    "traced_gaps", "sync_idle_between_s", "sync_blocked_s", "sync_blocked_between_s", "sync_loop_idle_s",
    "sync_loop_blocked_s",
)  # fmt: skip


def calls_by_kind(spent: list[list[float]], kinds: list[str]) -> dict:
    out = {}
    for kind in sorted(set(kinds)):
        times = [1e6 * sum(t) for t, k in zip(spent, kinds, strict=True) if k == kind]
        ends = [1e6 * t[2] for t, k in zip(spent, kinds, strict=True) if k == kind]
        out[kind] = {
            "steps": len(times),
            "mean_us": statistics.fmean(times),
            "median_us": statistics.median(times),
            "step_end_mean_us": statistics.fmean(ends),
            "us_per_step_of_all": sum(times) / len(kinds),
        }
    return out


def profile_text(profiler: cProfile.Profile, lines: int = 45) -> str:
    """The profiled agent calls' functions, by own time, then by cumulative time (pstats text)."""
    text = io.StringIO()
    stats = pstats.Stats(profiler, stream=text).strip_dirs()
    stats.sort_stats("tottime").print_stats(lines)
    stats.sort_stats("cumulative").print_stats(lines)
    return text.getvalue()


def step_time_ratio(
    preset: str, steps_per_mode: int, warmup: int, compile: bool, cupti: bool = False, profile_mode: str | None = None
) -> dict:
    """Step-time ratios of each agent variant and control to the agent off, and what they cost.

    The run is a sequence of rounds; each round runs one step of every mode, in a fresh random
    order, all on the same batch. So the data, slow drifts of the machine (clocks, other
    tenants, the host's scheduler) and any effect of a step's position hit every mode alike,
    and the bootstrap resamples whole rounds. Each variant's agent sees only its own steps; its
    sync counter is installed only around them.
    """
    # torch.compile needs static shapes: a fixed cu_seqlens size and a dummy tail (--static).
    cfg = TrainConfig(
        preset=preset,
        layout="thd",
        pack_length=8192,
        packs_per_step=1,
        device="cuda",
        dtype="bfloat16",
        progress=False,
        steps=10**6,
        log_every=10,
        compile=compile,
        static=compile,
    )
    trainer = Trainer(cfg)
    # Fixed data on the device (no host noise); warm-up runs every batch once, so that
    # torch.compile's recompilations (a new max_seqlen) are over before timing starts.
    pool = [trainer.next_batches() for _ in range(warmup)]
    spec = trainer.model_cfg.to_model_spec()
    variants = {**VARIANTS, **(CUPTI_VARIANT if cupti else {})}
    agents = {name: Agent(AgentConfig(log_every=cfg.log_every, **kw), model=spec) for name, kw in variants.items()}
    for a in agents.values():
        if a.config.sync_backend != "cupti":
            a.syncs.uninstall()
    # Controls, without the agent: two extra timing events per step ("events"), and a host-side
    # spin as long as the core agent's calls take in this loop ("spin", sized during warm-up).
    # They tell whether a slowdown is the agent's doing or what any host work of that size costs.
    controls = ["events", "spin"]
    warm_core: list[float] = []
    modes = ["off", *variants, *controls]
    events: dict[str, list] = {m: [] for m in modes}
    host: dict[str, list[float]] = {m: [] for m in modes}
    in_agent: dict[str, list[list[float]]] = {m: [] for m in variants}  # host time inside agent calls
    # Each recorded step's kind for its agent: plain, boundary (an interval closed in step_end),
    # emit (an interval reached the host and was sent), both; a traced emission is "emit+trace".
    kinds: dict[str, list[str]] = {m: [] for m in variants}
    profiler = cProfile.Profile() if profile_mode else None
    gc_s: dict[str, float] = dict.fromkeys(modes, 0.0)  # Python GC pauses during each mode's steps
    current: dict[str, Any] = {"mode": "off", "gc_start": 0.0}

    def on_gc(phase: str, info: dict) -> None:
        if phase == "start":
            current["gc_start"] = time.perf_counter()
        else:
            gc_s[current["mode"]] += time.perf_counter() - current["gc_start"]

    def step(i: int, mode: str, record: bool) -> None:
        agent = agents.get(mode)
        switched = agent is not None and agent.config.count_syncs and agent.config.sync_backend != "cupti"
        if switched and agent is not None:
            agent.syncs.install()
        current["mode"] = mode
        batches = pool[i % len(pool)]
        labels = sum(b.label_tokens for b in batches)
        t0 = time.perf_counter()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        spent = [0.0, 0.0, 0.0]  # host seconds in step_begin, observe_batch, step_end
        if agent is not None:
            a0 = time.perf_counter()
            agent.step_begin()
            spent[0] = time.perf_counter() - a0
        elif mode == "events":
            torch.Event(trainer.device, enable_timing=True).record()
        elif mode == "spin":
            until = time.perf_counter() + (statistics.median(warm_core) if warm_core else 50e-6)
            while time.perf_counter() < until:
                pass
        loss = torch.zeros((), device=trainer.device)
        for b in batches:
            if agent is not None:
                a0 = time.perf_counter()
                observe(agent, b)
                spent[1] += time.perf_counter() - a0
            loss += trainer.forward_backward(b, labels)
        lr, grad_norm = trainer.optimizer_step()
        if agent is not None:
            interval, last = agent._interval, agent.records[-1] if agent.records else None
            profiling = profiler if mode == profile_mode and record else None
            if profiling is not None:
                profiling.enable()
            a0 = time.perf_counter()
            agent.step_end(loss=loss, lr=lr, grad_norm=grad_norm)
            spent[2] = time.perf_counter() - a0
            if profiling is not None:
                profiling.disable()
            kind = "boundary" if agent._interval != interval else ""
            if agent.records and agent.records[-1] is not last:  # (a bounded deque: not its length)
                kind += "+emit" if agent.records[-1].get("traced_steps") is None else "+emit+trace"
            step_kind = kind.lstrip("+") or "plain"
        elif mode == "events":
            torch.Event(trainer.device, enable_timing=True).record()
        end.record()
        if record:
            events[mode].append((start, end))
            host[mode].append(time.perf_counter() - t0)
            if agent is not None:
                in_agent[mode].append(spent)
                kinds[mode].append(step_kind)
        elif mode == "core":
            warm_core.append(sum(spent))
        if switched and agent is not None:
            agent.syncs.uninstall()

    rng = random.Random(0)

    def rounds(n: int, record: bool) -> None:
        for r in range(n):
            for mode in rng.sample(modes, len(modes)):
                step(r, mode, record)

    rounds(warmup, record=False)
    gc.callbacks.append(on_gc)
    rounds(steps_per_mode, record=True)
    gc.callbacks.remove(on_gc)
    torch.cuda.synchronize()
    for a in agents.values():
        a.close()
    times = {m: [s.elapsed_time(e) / 1e3 for s, e in ev] for m, ev in events.items()}
    # Each agent takes one step a round, so its first `warmup` steps are the warm-up rounds, where
    # torch.compile compiles (and synchronizes); an interval that starts there counts as warm-up.
    records = list(agents["full"].records)
    steady = [r for r in records if r["first_step"] > warmup]
    warming = [r for r in records if r["first_step"] <= warmup]
    return {
        "model": preset,
        "parameters": trainer.model.num_params(),
        "tokens_per_step": 8192,
        "compiled": compile,
        "steps_per_mode": steps_per_mode,
        "spin_control_us": 1e6 * statistics.median(warm_core),
        "median_step_s": {m: statistics.median(t) for m, t in times.items()},
        "p10_p90_step_s": {m: statistics.quantiles(t, n=10)[::8] for m, t in times.items()},
        "median_host_loop_s": {m: statistics.median(t) for m, t in host.items()},
        "agent_calls_us_per_step": {
            m: {
                "median": 1e6 * statistics.median(map(sum, t)),
                "mean": 1e6 * statistics.fmean(map(sum, t)),
                **{
                    f"{call}_median": 1e6 * statistics.median(x[k] for x in t)
                    for k, call in enumerate(("step_begin", "observe_batch", "step_end"))
                },
            }
            for m, t in in_agent.items()
        },
        # Where the mean goes: each kind of step's count and mean host time in the agent's calls,
        # and its share of the mean over all steps (µs a step).
        "agent_calls_by_kind": {m: calls_by_kind(in_agent[m], kinds[m]) for m in variants},
        "agent_profile": profile_text(profiler) if profiler is not None else None,
        "gc_ms_per_step": {m: 1e3 * t / steps_per_mode for m, t in gc_s.items()},
        "ratios": {m: ratio_estimates(times[m], times["off"]) for m in [*variants, *controls]},
        # What the ledger's measurements gave in the steady intervals (docs/ledger.md).
        "ledger_fields": {
            name: [{k: r.get(k) for k in LEDGER_FIELDS} for r in agents[name].records if r["first_step"] > warmup][:8]
            for name in variants
        },
        "agent_reported_syncs_per_iter": syncs_per_step(steady),  # steady state: after the warm-up rounds
        "agent_reported_sync_sites": dict(sync_sites(steady)),
        "agent_reported_syncs_warmup": {
            "steps": sum(r["steps"] for r in warming),
            "syncs": sum(r["syncs"]["total"] for r in warming),
            "per_iter": syncs_per_step(warming),
            "sites": dict(sync_sites(warming)),
        },
        "agent_reported_thd_tflops": sum(r["flops_thd"] for r in steady) / sum(r["gpu_time_s"] for r in steady) / 1e12,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps-per-mode", type=int, default=400)
    ap.add_argument("--presets", default="125m", help="comma-separated model presets (125m is the target's)")
    ap.add_argument(
        "--builds", default="eager,compiled", help="comma-separated: eager, compiled (torch.compile), in this order"
    )
    ap.add_argument("--warmup", type=int, default=32, help="warm-up rounds, one per distinct batch")
    ap.add_argument("--out", default=None)
    ap.add_argument("--cupti", action="store_true", help="also the full agent with the CUPTI counter and its trace")
    ap.add_argument(
        "--profile-mode",
        default=None,
        help="cProfile this agent variant's step_end calls (e.g. full+cupti): where its host time goes, "
        "by function; the profiler's own cost lands in that mode's ratio",
    )
    args = ap.parse_args()
    builds = args.builds.split(",")
    if not builds or set(builds) - {"eager", "compiled"}:
        ap.error(f"--builds: eager and/or compiled, not {args.builds!r}")
    if args.warmup < 1 or args.steps_per_mode < 2:
        ap.error("--warmup needs at least 1 round (one per batch) and --steps-per-mode at least 2")
    variants = [*VARIANTS, *(CUPTI_VARIANT if args.cupti else {})]
    if args.profile_mode is not None and args.profile_mode not in variants:
        ap.error(f"--profile-mode: one of {', '.join(variants)}, not {args.profile_mode!r}")
    result: dict[str, Any] = {
        "bench": "agent_overhead",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "host_cost_cpu": host_cost_us(torch.device("cpu")),
    }
    if torch.cuda.is_available():
        result["event_call_us"] = event_call_costs_us()
        result["host_cost_cuda"] = host_cost_us(torch.device("cuda"))
        for preset in args.presets.split(","):
            for build in builds:
                compile = build == "compiled"
                key = f"step_time_{preset}_{build}"
                print(f"measuring {key} ...", file=sys.stderr)
                result[key] = step_time_ratio(
                    preset, args.steps_per_mode, args.warmup, compile, args.cupti, args.profile_mode
                )
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    print(
        "\nagent host cost per step (us, median): "
        f"cpu plain {result['host_cost_cpu']['plain_step_us_median']:.0f}, "
        f"cpu log step {result['host_cost_cpu']['log_step_us_median']:.0f}",
        file=sys.stderr,
    )
    for key in [k for k in result if k.startswith("step_time_")]:
        st = result[key]
        print(
            f"{key[10:]}: median step off {st['median_step_s']['off'] * 1e3:.2f} ms; ratios to off "
            "with 95% intervals (target <= 1.005)",
            file=sys.stderr,
        )
        for m, est in st["ratios"].items():
            print(
                f"  {m:>10}: "
                + "   ".join(
                    f"{kind} {e['ratio']:.4f} [{e['ci95'][0]:.4f}, {e['ci95'][1]:.4f}]" for kind, e in est.items()
                ),
                file=sys.stderr,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
