"""Where the HF callback's "on" steps spend their extra time, on the GPU's timeline: the switched
schedule of `integration_overhead.py ratio` (the same Switch, model and batches), its timed rounds
under torch.profiler (CPU and CUDA activities). (First used on the H200 on 2026-12-03: the extra
time was idle, not kernels; docs/benchmarks/2026-12-03-h200.md#h200-2026-12-03-evening.)

Each kernel, memcpy and memset belongs to the step in whose host window (the Switch's on_step_begin to its
on_step_end, where the CUDA events are recorded) its runtime launch ran. Per mode, the medians over
ordinary steps (no reading of kept micro-batches, no interval closed) of the event-timed step, the
activities' count, the GPU's busy time, its span and the idle time inside it, and the lead and tail
between the events and the first and last activity. Ordinary steps of every mode launch the same
sequence; activity k of a variant's steps is set against activity k of the off steps, and the gaps
before activity k (its start minus the previous one's end) that grow the most are listed with the
kernels on both sides, the CPU op that launched it and the part of the step it was launched in
(ranges named `gaps:` around training_step, clip_grad_norm, the hook and the Switch's calls, and
torch's own Optimizer.step range), with the per-gap and per-kernel growth summed. And, as
`ratio` pairs them, each ordinary variant step against its round's off step: the busy time and the
gaps summed by part of the step, per variant and pooled (`paired_us_by_phase`, mean ± standard
error). The profiler's own host work lengthens the host-bound stretches: compare modes inside
one run, not its step times with `ratio`'s.

    python bench/step_gaps.py [--rounds 12] [--warmup-rounds 5] [--variants full,core,hook,methods] [--seed 0] [--out F]
    python bench/integration_overhead.py table F...   # a summary

On CPU there are no device activities: it runs the code path and reports step times only.
Prints one JSON object (and writes it to --out).
"""

from __future__ import annotations

import argparse
import bisect
import itertools
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

from integration_overhead import (
    DIAGNOSTIC_VARIANTS,
    LOG_EVERY,
    VARIANTS,
    emit,
    flops_spec,
    hf_trainer,
    make_model,
    round_schedule,
    switched_hf,
)

GAP_LABEL = "gaps:"  # the profiler ranges this mode puts around the step's parts
DEVICE_KINDS = ("kernel", "gpu_memcpy", "gpu_memset")  # what occupies the GPU (not syncs, not ranges)
SYNC_NAMES = ("Event Sync", "Stream Sync", "Context Sync", "Stream Wait Event", "Unknown")


class Activity(NamedTuple):
    """One kernel, memcpy or memset as the GPU ran it (ns on the profiler's clock)."""

    start: int
    end: int
    name: str
    launch: int  # when the host's runtime call launched it
    op: str  # the innermost CPU op that launched it


class StepTrace(NamedTuple):
    """One optimizer step: what the Switch measured and the device activities launched in it."""

    mode: str
    read: bool  # the callback read kept micro-batches or closed an interval in it
    cuda_ms: float  # between the Switch's two CUDA events
    host_us: float | None  # in the callback (None for "off")
    window: tuple[int, int]  # host: from Switch.on_step_begin's start to Switch.on_step_end's end
    activities: list[Activity]  # by start on the GPU
    previous_end: int  # the end of the last activity the GPU ran before this step's first
    phases: list[tuple[int, int, str]]  # the step's ranges on the Trainer's thread: start, end, name[i]


def annotated(fn: Callable[..., Any], label: str) -> Callable[..., Any]:
    """`fn` inside a profiler range named `label` (a user annotation in the trace)."""
    import torch

    def call(*args: Any, **kwargs: Any) -> Any:
        with torch.profiler.record_function(label):
            return fn(*args, **kwargs)

    return call


def activity_kind(event: Any) -> str:
    """kineto's type of one event ("kernel", "cuda_runtime", "cpu_op", ...); on a torch whose
    events lack `activity_type`, told from its device, flags and name."""
    if hasattr(event, "activity_type"):
        return event.activity_type()
    from torch.autograd import DeviceType

    on_device = event.device_type() != DeviceType.CPU
    if event.is_user_annotation():
        return "gpu_user_annotation" if on_device else "user_annotation"
    if on_device:
        return "cuda_sync" if event.name() in SYNC_NAMES else "kernel"
    return "cuda_runtime" if event.name().startswith("cu") else "cpu_op"


def read_trace(results: Any) -> tuple[list[Activity], list[tuple[int, int, str, int]]]:
    """The device activities (by start) and the user annotations (start, end, name, thread) of a
    kineto result. An activity's CUPTI correlation id names its runtime launch on the host; its
    linked id names the CPU op that the launch ran in."""
    launches: dict[int, int] = {}
    ops: dict[int, str] = {}
    device: list[tuple[int, int, str, int, int]] = []
    annotations: list[tuple[int, int, str, int]] = []
    for event in results.events():
        kind = activity_kind(event)
        if kind in DEVICE_KINDS:
            device.append(
                (event.start_ns(), event.end_ns(), event.name(), event.correlation_id(), event.linked_correlation_id())
            )
        elif kind in ("cuda_runtime", "cuda_driver"):
            launches[event.correlation_id()] = event.start_ns()
        elif kind == "cpu_op":
            ops[event.correlation_id()] = event.name()
        elif kind == "user_annotation":
            annotations.append((event.start_ns(), event.end_ns(), event.name(), event.start_thread_id()))
    activities = [
        Activity(start, end, name, launches[corr], ops.get(op, "?"))
        for start, end, name, corr, op in device
        if corr in launches  # (one launched before the profiler started has none)
    ]
    return sorted(activities), sorted(annotations)


def trace_steps(
    activities: list[Activity], annotations: list[tuple[int, int, str, int]], events: list, host: list
) -> list[StepTrace]:
    """The profiled steps, each with the activities launched inside its host window; `events` and
    `host` are the Switch's records of the same (the last) steps."""
    begins = [a for a in annotations if a[2] == GAP_LABEL + "on_step_begin"]
    ends = [a for a in annotations if a[2] == GAP_LABEL + "on_step_end"]
    if len(begins) != len(ends) or len(begins) < len(events):
        raise RuntimeError(f"{len(begins)} step begins and {len(ends)} ends in the trace for {len(events)} steps")
    windows = [(b[0], e[1]) for b, e in zip(begins, ends, strict=True)][len(begins) - len(events) :]
    thread = begins[0][3]  # the Trainer's: its ranges mark the step's parts
    marks = [a for a in annotations if a[3] == thread and a[2].startswith((GAP_LABEL, "Optimizer."))]
    launched: list[list[Activity]] = [[] for _ in windows]
    starts = [w[0] for w in windows]
    for activity in activities:
        k = bisect.bisect_right(starts, activity.launch) - 1
        if k >= 0 and activity.launch <= windows[k][1]:
            launched[k].append(activity)
    host_times = iter(spent for _, spent in host[len(host) - sum(mode != "off" for mode, *_ in events) :])
    steps = []
    for (mode, begin, end, read), window, acts in zip(events, windows, launched, strict=True):
        first = bisect.bisect_left(activities, acts[0]) if acts else 0
        seen: Counter[str] = Counter()
        phases = []
        for start, stop, name, _ in marks:
            if window[0] <= start <= window[1]:
                name = name.removeprefix(GAP_LABEL)
                seen[name] += 1
                phases.append((start, stop, f"{name}[{seen[name]}]"))
        steps.append(
            StepTrace(
                mode=mode,
                read=read,
                cuda_ms=begin.elapsed_time(end),
                host_us=None if mode == "off" else 1e6 * next(host_times),
                window=window,
                activities=acts,
                previous_end=activities[first - 1].end if first > 0 else window[0],
                phases=phases,
            )
        )
    return steps


def step_figures(step: StepTrace) -> dict[str, float]:
    """µs: the GPU's busy time (union of the activities), span (first start to last end), idle
    inside the span, and the lead and tail: from the begin event to the first activity, and from
    the last to the end event, each event placed at the later of its host record and the end of
    the GPU's work before it."""
    acts = step.activities
    figures = {"step_us": 1e3 * step.cuda_ms, "activities": len(acts)}
    if not acts:
        return figures
    busy, covered = 0, acts[0].start
    for a in acts:
        busy += max(0, a.end - max(a.start, covered))
        covered = max(covered, a.end)
    span = covered - acts[0].start
    return {
        **figures,
        "busy_us": busy / 1e3,
        "span_us": span / 1e3,
        "idle_us": (span - busy) / 1e3,
        "lead_us": (acts[0].start - max(step.window[0], step.previous_end)) / 1e3,
        "tail_us": (max(step.window[1], covered) - covered) / 1e3,
        "step_minus_span_us": 1e3 * step.cuda_ms - span / 1e3,
    }


def gaps_of(step: StepTrace) -> list[float]:
    """µs: the lead, the gap before each activity after the first (its start minus the previous
    one's end), the tail."""
    figures, acts = step_figures(step), step.activities
    inner = [(b.start - a.end) / 1e3 for a, b in itertools.pairwise(acts)]
    return [figures["lead_us"], *inner, figures["tail_us"]]


def phase_of(step: StepTrace, t: int) -> str:
    """The innermost of the step's ranges that holds `t`, else "after" the one that ended last before
    it (so a launch after training_step[1] returned, once its nested hook range is over, reads
    "after training_step[1]", and a backward kernel launched after the hook "training_step[1]")."""
    holding = [(start, name) for start, stop, name in step.phases if start <= t <= stop]
    if holding:
        return max(holding)[1]
    ended = [(stop, name) for _, stop, name in step.phases if stop < t]
    return f"after {max(ended)[1]}" if ended else "before any range"


def modal(steps: list[StepTrace]) -> tuple[int, tuple[str, ...]]:
    """The most common activity count of `steps`, and the most common name sequence of that count."""
    count = Counter(len(s.activities) for s in steps).most_common(1)[0][0]
    names = Counter(tuple(a.name for a in s.activities) for s in steps if len(s.activities) == count)
    return count, names.most_common(1)[0][0]


def per_index_median(rows: list[list[float]]) -> list[float]:
    return [statistics.median(column) for column in zip(*rows, strict=True)]


def compare_gaps(off: list[StepTrace], on: list[StepTrace], top: int) -> dict[str, Any]:
    """Activity k of an ordinary "on" step against activity k of an ordinary "off" step (the same
    kernel sequence): where the GPU's extra time sits, gap by gap, and whether kernels ran longer."""
    (n_off, names_off), (n_on, names_on) = modal(off), modal(on)
    result: dict[str, Any] = {
        "activities": {"off": n_off, "on": n_on},
        "steps_with_that_count": {
            "off": sum(len(s.activities) == n_off for s in off),
            "on": sum(len(s.activities) == n_on for s in on),
        },
        "same_sequence": names_off == names_on,
    }
    if names_off != names_on:
        k = next((i for i, (a, b) in enumerate(zip(names_off, names_on, strict=False)) if a != b), min(n_off, n_on))
        result["first_difference"] = {
            "index": k,
            "off": names_off[k] if k < n_off else None,
            "on": names_on[k] if k < n_on else None,
        }
    if n_off != n_on:
        return result  # nothing to align
    off, on = [s for s in off if len(s.activities) == n_off], [s for s in on if len(s.activities) == n_on]

    def durations(step: StepTrace) -> list[float]:
        return [(a.end - a.start) / 1e3 for a in step.activities]

    off_gaps = per_index_median([gaps_of(s) for s in off])
    gap_diff = [b - a for a, b in zip(off_gaps, per_index_median([gaps_of(s) for s in on]), strict=True)]
    off_durations = per_index_median([durations(s) for s in off])
    duration_diff = [b - a for a, b in zip(off_durations, per_index_median([durations(s) for s in on]), strict=True)]
    example = on[0]  # an "on" step, for the names of the CPU ops and the step's parts
    acts = example.activities

    def where(k: int) -> dict[str, Any]:
        """Gap k lies before activity k (k = 0: after the begin event; k = n: the end event)."""
        return {
            "gap": k,
            "after": acts[k - 1].name[:100] if k > 0 else "(the begin event)",
            "before": acts[k].name[:100] if k < len(acts) else "(the end event)",
            "launched_by": acts[k].op if k < len(acts) else "Switch.on_step_end",
            "launched_in": phase_of(example, acts[k].launch) if k < len(acts) else "(tail)",
        }

    by_phase: dict[str, float] = {}
    for k, diff in enumerate(gap_diff):
        phase = where(k)["launched_in"]
        by_phase[phase] = by_phase.get(phase, 0.0) + diff
    result["gaps_sum_us"] = sum(gap_diff)
    result["durations_sum_us"] = sum(duration_diff)
    result["gap_us_by_phase"] = {name: round(us, 1) for name, us in sorted(by_phase.items(), key=lambda kv: -kv[1])}
    result["top_gaps"] = [
        {**where(k), "off_us": round(off_gaps[k], 2), "diff_us": round(gap_diff[k], 2)}
        for k in sorted(range(len(gap_diff)), key=lambda k: -gap_diff[k])[:top]
    ]
    result["top_longer_activities"] = [
        {"activity": k, "name": acts[k].name[:100], "launched_by": acts[k].op, "diff_us": round(duration_diff[k], 2)}
        for k in sorted(range(len(duration_diff)), key=lambda k: -duration_diff[k])[:5]
    ]
    return result


def idle_by_phase(step: StepTrace, phases: list[str]) -> dict[str, float]:
    """µs: the step's busy time and its gaps summed by `phases` (one a gap, as phase_map gives)."""
    sums = {"busy": step_figures(step)["busy_us"]}
    for phase, gap in zip(phases, gaps_of(step), strict=True):
        sums[phase] = sums.get(phase, 0.0) + gap
    return sums


def phase_map(step: StepTrace) -> list[str]:
    """The phase of each gap of `step`: the lead, the part of the step activity k was launched in, the tail."""
    return ["lead", *(phase_of(step, a.launch) for a in step.activities[1:]), "tail"]


def paired_phases(by_round: list[dict[str, StepTrace]], variants: tuple[str, ...]) -> dict[str, Any]:
    """Each ordinary variant step against its round's off step, phase by phase (the phases of an off
    step, which has no hook range; every step of the same kernel count has the same gaps): the
    median, mean and standard error of the differences, per variant and with the variants pooled,
    so that the round-to-round drift of kernel times and the host-bound stretches' noise cancel
    as in the ratio mode's pairs."""
    count, _ = modal([r["off"] for r in by_round if not r["off"].read])
    reference = next((r["off"] for r in by_round if len(r["off"].activities) == count), None)
    if not count or reference is None:
        return {}
    phases = phase_map(reference)
    diffs: dict[str, list[dict[str, float]]] = {variant: [] for variant in variants}
    for r in by_round:
        if len(r["off"].activities) != count:
            continue
        off = idle_by_phase(r["off"], phases)
        for variant in variants:
            if not r[variant].read and len(r[variant].activities) == count:
                on = idle_by_phase(r[variant], phases)
                diffs[variant].append(
                    {"step": 1e3 * (r[variant].cuda_ms - r["off"].cuda_ms)} | {k: on[k] - off[k] for k in off}
                )

    def spread(rows: list[dict[str, float]]) -> dict[str, Any]:
        if len(rows) < 2:
            return {}
        return {
            "pairs": len(rows),
            **{
                k: {
                    "median": round(statistics.median(r[k] for r in rows), 1),
                    "mean": round(statistics.fmean(r[k] for r in rows), 1),
                    "se": round(statistics.stdev(r[k] for r in rows) / len(rows) ** 0.5, 1),
                }
                for k in rows[0]
            },
        }

    return {variant: spread(rows) for variant, rows in diffs.items()} | {
        "pooled": spread(list(itertools.chain(*diffs.values())))
    }


def step_medians(steps: list[StepTrace]) -> dict[str, float]:
    """The median of each of step_figures' figures over `steps`, and of the host time in the callback."""
    rows = [step_figures(s) for s in steps]
    keys = [k for k in rows[0] if all(k in r for r in rows)] if rows else []
    figures = {k: round(statistics.median(r[k] for r in rows), 2) for k in keys}
    host_us = [s.host_us for s in steps if s.host_us is not None]
    return {**figures, **({"host_us_in_callback": round(statistics.median(host_us), 1)} if host_us else {})}


def step_gaps(
    rounds: int, warmup_rounds: int, model_kind: str, device: str, variants: tuple[str, ...], seed: int, top: int = 15
) -> dict[str, Any]:
    import torch
    from transformers import TrainerCallback

    from packscope.agent.integrations.hf import PackscopeCallback

    modes = ("off", *variants)
    schedule = round_schedule(modes, warmup_rounds + rounds, seed)
    model = make_model(model_kind, device)
    events: list[tuple[str, Any, Any, bool]] = []
    host: list[tuple[str, float]] = []
    inner = PackscopeCallback(
        run_name="gaps-hf", model=flops_spec(), log_every=LOG_EVERY, count_syncs="full" in variants
    )
    switch = switched_hf(inner, model, schedule, events, host, device)
    # Ranges in the trace: the Switch's two calls bound a step's window (its CUDA events are
    # recorded there); the others name the part of the step an activity was launched in.
    for name in ("on_step_begin", "on_step_end"):
        setattr(switch, name, annotated(getattr(switch, name), GAP_LABEL + name))
    register = model.register_forward_hook
    model.register_forward_hook = lambda hook, *a, **k: register(annotated(hook, GAP_LABEL + "forward_hook"), *a, **k)
    profiler = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU]
        + ([torch.profiler.ProfilerActivity.CUDA] if device == "cuda" else [])
    )
    first_profiled = len(modes) * max(0, warmup_rounds - 1)  # a round early: the profiler's start-up stays out

    class StartProfiler(TrainerCallback):  # before the Switch: its window lies inside the trace
        def on_step_begin(self, args, state, control, **kwargs):
            if state.global_step == first_profiled:
                profiler.start()

    trainer = hf_trainer(model, len(schedule), [StartProfiler(), switch], device)
    trainer.training_step = annotated(trainer.training_step, GAP_LABEL + "training_step")
    if hasattr(trainer, "_clip_grad_norm"):  # tells it apart from the NaN check before it
        trainer._clip_grad_norm = annotated(trainer._clip_grad_norm, GAP_LABEL + "clip_grad_norm")
    trainer.train()
    profiler.stop()
    t0 = time.perf_counter()
    activities, annotations = read_trace(profiler.profiler.kineto_results)  # type: ignore[union-attr]
    timed = len(modes) * warmup_rounds
    steps = trace_steps(activities, annotations, events[timed:], host)
    ordinary = {mode: [s for s in steps if s.mode == mode and not s.read] for mode in modes}
    by_mode = {mode: step_medians(ordinary[mode]) for mode in modes}
    result: dict[str, Any] = {
        "integration": "hf",
        "model": model_kind,
        "rounds": rounds,
        "warmup_rounds": warmup_rounds,
        "seed": seed,
        "device_activities_in_trace": len(activities),
        "steps": {
            mode: {"ordinary": len(ordinary[mode]), "read": sum(s.mode == mode and s.read for s in steps)}
            for mode in modes
        },
        "medians_over_ordinary_steps": by_mode,
        "variants": {},
        "steps_us": [[s.mode, s.read, {k: round(v, 1) for k, v in step_figures(s).items()}] for s in steps],
    }
    by_round = [{s.mode: s for s in steps[i : i + len(modes)]} for i in range(0, len(steps), len(modes))]
    for variant in variants:
        # Each ordinary step of the variant against its round's off step, as the ratio mode pairs them.
        pairs = [r[variant].cuda_ms - r["off"].cuda_ms for r in by_round if not r[variant].read]
        entry: dict[str, Any] = {
            "paired_step_diff_us": round(1e3 * statistics.median(pairs), 1) if pairs else None,
            "median_diff_us": {
                k: round(v - by_mode["off"][k], 2) for k, v in by_mode[variant].items() if k in by_mode["off"]
            },
        }
        if ordinary["off"] and ordinary[variant] and any(s.activities for s in ordinary["off"]):
            entry["gaps"] = compare_gaps(ordinary["off"], ordinary[variant], top)
        result["variants"][variant] = entry
    if any(s.activities for s in steps):
        result["paired_us_by_phase"] = paired_phases(by_round, variants)
    result["analysis_s"] = round(time.perf_counter() - t0, 1)
    return result


def print_table(path: Path, name: str, r: dict[str, Any]) -> None:
    """A few lines for a result (`integration_overhead.py table` calls it for gaps_* entries): the
    off step, each variant against it, the pooled pairs."""
    off = r["medians_over_ordinary_steps"]["off"]
    print(
        f"{path.stem} {name} off: step {off['step_us'] / 1e3:.2f} ms, "
        f"busy {off.get('busy_us', 0) / 1e3:.2f} ms, idle {off.get('idle_us', 0):.0f} us, "
        f"{off['activities']:.0f} activities"
    )
    for variant, v in r["variants"].items():
        diff, gaps = v["median_diff_us"], v.get("gaps", {})
        top = ", ".join(
            f"{g['diff_us']:+.0f} us before {g['before'][:40]} ({g['launched_in']})"
            for g in gaps.get("top_gaps", [])[:3]
        )
        print(
            f"{path.stem} {name} {variant}: step {v['paired_step_diff_us']:+.0f} us paired, "
            f"busy {diff.get('busy_us', 0):+.0f}, idle {diff.get('idle_us', 0):+.0f}, "
            f"lead {diff.get('lead_us', 0):+.0f}, tail {diff.get('tail_us', 0):+.0f} us (medians); "
            f"same sequence {gaps.get('same_sequence')}, "
            f"gaps summed {gaps.get('gaps_sum_us', 0):+.0f} us; top: {top}"
        )
    pooled = r.get("paired_us_by_phase", {}).get("pooled", {})
    if pooled:
        phases = ", ".join(f"{k} {v['mean']:+.0f}±{v['se']:.0f}" for k, v in pooled.items() if isinstance(v, dict))
        print(f"{path.stem} {name} pooled pairs ({pooled['pairs']}), on - off, mean±se us: {phases}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=12, help="timed rounds (one step off, one per variant)")
    ap.add_argument("--warmup-rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0, help="the seed of the rounds' order")
    known = VARIANTS + tuple(v for v in DIAGNOSTIC_VARIANTS if v != "null")
    ap.add_argument("--variants", default=",".join(known), help=f"comma-separated, of {', '.join(known)}")
    ap.add_argument("--model", choices=["stand-in", "qwen2-303m"], default=None, help="default by device")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    variants = tuple(args.variants.split(","))
    if not variants or set(variants) - set(known):
        ap.error(f"--variants takes a comma-separated list of {', '.join(known)}")
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = args.model or ("qwen2-303m" if device == "cuda" else "stand-in")
    result: dict[str, Any] = {
        "bench": "step_gaps",
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
    }
    print("step gaps: hf ...", file=sys.stderr)
    result["gaps_hf"] = step_gaps(args.rounds, args.warmup_rounds, model, device, variants, args.seed)
    emit(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
