"""The loss ledger of one window of a run (docs/ledger.md): from the hardware's peak down to the
useful FLOPs, as named terms, each a fraction of the step time (then in ms per step and
GPU-hours), and whether it is measured, estimated or not measured. Pure arithmetic on the
window's catalogue sums and its per-rank sums: the route and `packscope diagnose` only show it.

A term without its inputs has no value (None), never 0: 0 is what a measured absence gives.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal, NamedTuple

from packscope.core.catalogue import FLOAT_OPS, METRIC, SUM_NAMES, Coefficients, flops_count, sync_counted_steps

Status = Literal["measured", "estimated", "not measured", "not applicable"]
MEASURED: Status = "measured"
ESTIMATED: Status = "estimated"
NOT_MEASURED: Status = "not measured"
NOT_APPLICABLE: Status = "not applicable"
# The data wait's label, the catalogue's: the host's time between steps, the loader's or not.
BETWEEN_STEPS = METRIC["data_wait_step_s"].label

# The layouts (RunSummary.layout) whose rows the model ran as dense sequences: its attention
# covered each whole row, padding included, so the baseline count is the work done. The packed
# layouts attend within each document, the per-document count.
_DENSE_LAYOUTS = frozenset({"bshd"})
_PACKED_LAYOUTS = frozenset({"thd", "thd-static"})


@dataclass(frozen=True)
class Term:
    """One line of the ledger: `fraction` of the window's step time (None: not measured or not
    applicable), what it stands on (`source`), and the fix in one sentence."""

    name: str
    label: str
    fraction: float | None
    status: Status
    source: str
    fix: str = ""
    detail: dict[str, Any] = field(default_factory=dict)
    loss: bool = True  # False for the two ends of the walk: the peak and the useful work
    # False for time outside the event-timed step (the data wait between steps): it lengthens the
    # iteration, not the step that the peak and the useful work are priced over.
    within_step: bool = True
    # Of a within-step term's fraction, the part that lies between steps (the syncs' idle that
    # runs on past the step's end): it lengthens the iteration, as the data wait does.
    between: float = 0.0

    @property
    def in_step(self) -> float:
        """The part of the fraction inside the event-timed step (0 for none or no value)."""
        return (self.fraction or 0.0) - self.between if self.within_step else 0.0

    @property
    def outside_step(self) -> float:
        """The part of the fraction between steps: it lengthens the iteration, not the step."""
        return self.between if self.within_step else (self.fraction or 0.0)


def _metric(name: str, sums: Mapping[str, float], c: Coefficients) -> float | None:
    value = METRIC[name].formula(sums, c, FLOAT_OPS)
    return value if math.isfinite(value) else None


def step_time_s(sums: Mapping[str, float], c: Coefficients) -> float | None:
    """A rank's step time over `sums` (the catalogue's step_time_s), None where no step ran."""
    return _metric("step_time_s", sums, c)


def peak_term(sums: Mapping[str, float], c: Coefficients) -> Term:
    if not c.peak_tflops:
        return Term("peak", "hardware peak", None, NOT_MEASURED, "the GPU's dense bf16 peak is unknown", loss=False)
    peak_flops = c.peak_tflops * 1e12 * sums["gpu_seconds"]
    return Term(
        "peak", "hardware peak", 1.0, MEASURED,
        f"{c.peak_tflops:g} TFLOP/s per GPU × Σ GPU time (the whole step, every GPU)",
        detail={"peak_tflops": c.peak_tflops, "peak_flops": peak_flops}, loss=False,
    )  # fmt: skip


def useful_term(sums: Mapping[str, float], c: Coefficients) -> Term:
    mfu = _metric("mfu_useful", sums, c)
    if mfu is None:
        why = "the GPU's dense bf16 peak is unknown" if not c.peak_tflops else "no GPU time in the window"
        return Term("useful", "useful work", None, NOT_MEASURED, why, loss=False)
    return Term(
        "useful", "useful work", mfu, MEASURED,
        "useful FLOPs (real tokens, attention within each document) at the peak rate: the useful MFU",
        detail={"flops_useful": flops_count("useful", sums, c), "mfu_useful": mfu}, loss=False,
    )  # fmt: skip


def padding_term(sums: Mapping[str, float], c: Coefficients, layout: str | None) -> Term:
    """The share of the FLOPs the layout computed that served no real token (linear layers on
    padding slots, and on a dense layout attention beyond each document), times the step time."""
    dense = layout in _DENSE_LAYOUTS
    computed = flops_count("bshd" if dense else "thd", sums, c)
    useful = flops_count("useful", sums, c)
    share = FLOAT_OPS.ratio(computed - useful, computed)
    if not math.isfinite(share):
        return Term("padding", "padding", None, NOT_MEASURED, "no token ran in the window")
    known = dense or layout in _PACKED_LAYOUTS
    attention = (
        "and attention over each whole row" if dense else "only (a lower bound: attention over padding unpriced)"
    )
    source = (
        f"token slots without a real token: linear layers {attention}; their share of the computed FLOPs × step time"
    )
    if not known:
        source += f"; layout {layout!r}: some rows may have attended over their padding"
    fix = (
        "pack documents into full rows with per-document attention (THD) instead of padding each row"
        if dense
        else "fill the packs' tails: more documents per pack, or a pack length nearer the documents'"
    )
    return Term(
        "padding", "padding", share, MEASURED if known else ESTIMATED, source, fix,
        detail={"padding_pct": _metric("padding_pct", sums, c), "flops": computed - useful},
    )  # fmt: skip


SYNC_FIX = (
    "keep the values on the device and read them at log boundaries, at the sites named: "
    "no .item()/.tolist() in control flow, pinned host tensors copied with non_blocking=True, "
    "no per-document Python loop over device values"
)


def _traced(sums: Mapping[str, float]) -> str:
    n = sums["traced_steps"]
    return f"{n:.0f} step{'s' * (n != 1)} traced by CUPTI, scaled to every step"


def sync_wait_s(sums: Mapping[str, float]) -> float | None:
    """Per step gap, the part of the data wait that host syncs began: the GPU's idle time in the
    traced gaps between steps that a sync began (it drained into the sync before the step's end
    and idled on past it), per traced gap, at most the data wait per gap (its share of all the
    window's gaps). None where not measured: no traced gap (records of an agent before this
    split, or no trace), or no data wait measured."""
    if not sums["traced_gaps"] or not sums["data_wait_gaps"] or sums["traced_step_time_s"] <= 0:
        return None
    return min(sums["sync_idle_between_s"] / sums["traced_gaps"], sums["data_wait_s"] / sums["data_wait_gaps"])


def host_blocked_s(sums: Mapping[str, float]) -> float | None:
    """The host's time blocked in sync calls per iteration, in the traced steps (per step) and
    the traced gaps between them (per gap): the time it would have had, without them, to run
    ahead of the GPU. None where no record of the window measured it (an agent before it)."""
    if not sums["blocked_traced_steps"]:
        return None
    gaps = sums["blocked_traced_gaps"]
    between = sums["sync_blocked_between_s"] / gaps if gaps else 0.0
    return sums["sync_blocked_s"] / sums["blocked_traced_steps"] + between


def sync_loop_s(sums: Mapping[str, float], step_s: float) -> tuple[float, float] | None:
    """Per iteration, the GPU's idle time inside the syncs' loops (regions bracketed by reads that
    each waited at most a few small kernels: the host's own work between them, which the loop's
    fix removes with the reads) and the host's time blocked in the reads that closed them, over
    the traced steps of the records that split it; None where none did (an agent before it)."""
    if sums["loop_traced_step_time_s"] <= 0:
        return None
    idle = sums["sync_loop_idle_s"] / sums["loop_traced_step_time_s"] * step_s
    return idle, sums["sync_loop_blocked_s"] / sums["loop_traced_steps"]


class SyncSplit(NamedTuple):
    """The GPU's idle time per iteration (s) as the host syncs' (inside the step and between
    steps, out of the data wait) and the launch-bound term's, from the traced steps."""

    inside_s: float  # the syncs' part inside the step
    between_s: float | None  # their part between steps (None: not measured, all kept in the data wait)
    launch_s: float  # the launch-bound term's
    blocked_s: float | None  # the host's time blocked in syncs, where measured: it caps the syncs' time
    loop_s: float | None = None  # of inside_s, the idle inside the syncs' loops (None: not split)


def sync_split(sums: Mapping[str, float], step_s: float | None) -> SyncSplit | None:
    """Where the host's blocked time is measured, the syncs' time is the idle inside their loops
    (`sync_loop_s`: the host's work between reads that return at once, which the fix removes with
    the reads) and, for the rest, what the host's time blocked in the other syncs would have let it
    run ahead into: at most the GPU's other idle per iteration (inside the step and between steps)
    and at most that blocked time, taken first from the idle after the syncs, then from the time
    between steps, then from the launch-bound idle; idle after a sync beyond it is the host's
    (launch-bound: without the sync it would have idled the GPU anyway). Without it (an older
    agent's records) the rules on the trace alone: the idle after syncs inside the steps and the
    idle between steps in gaps a sync began. None without a trace or a step time."""
    traced = sums["traced_step_time_s"]
    if traced <= 0 or step_s is None:
        return None
    after_syncs = sums["sync_idle_s"] / traced * step_s
    launch = sums["launch_idle_s"] / traced * step_s
    blocked = host_blocked_s(sums)
    if blocked is None:
        return SyncSplit(after_syncs, sync_wait_s(sums), launch, None)
    measured_loop = sync_loop_s(sums, step_s)
    loop_idle, loop_blocked = measured_loop or (0.0, 0.0)
    loop = min(loop_idle, after_syncs)
    after_others = after_syncs - loop
    gap = sums["data_wait_s"] / sums["data_wait_gaps"] if sums["data_wait_gaps"] else 0.0
    syncs = min(after_others + gap + launch, max(blocked - loop_blocked, 0.0))
    inside = min(syncs, after_others)
    between = min(syncs - inside, gap)
    from_launch = syncs - inside - between
    launch_s = launch + after_others - inside - from_launch
    return SyncSplit(loop + inside + from_launch, between, launch_s, blocked, None if measured_loop is None else loop)


def sync_term(
    sums: Mapping[str, float],
    c: Coefficients,
    sites: Sequence[tuple[str, float]],
    step_s: float | None,
    split: SyncSplit | None,
) -> Term:
    """Host synchronizations: their count per iteration is measured on the counted steps; their
    time comes from the steps CUPTI traced (estimated: a sample of the steps), by `split`
    (`sync_split`, which the data wait and launch-bound terms share):
    with the host's blocked time, the GPU idle it would have let the host run ahead into; without
    it, the idle after the syncs inside the steps and, per step gap, the idle between steps in
    gaps a sync began (`sync_wait_s`). Its part between steps comes out of the data wait. Without
    a trace only a count of none is a time (0)."""
    per_iter = _metric("syncs_per_iter", sums, c)
    if per_iter is None:
        return Term(
            "host_syncs", "host synchronizations", None, NOT_MEASURED,
            "no step of the window had its syncs counted", SYNC_FIX, {"syncs_per_iter": None, "sites": []},
        )  # fmt: skip
    counted = sync_counted_steps(sums)
    total = sum(count for _, count in sites)
    detail: dict[str, Any] = {
        "syncs_per_iter": per_iter,
        "counted_share": counted / sums["rank_steps"],
        "sites": [{"site": site, "per_iter": count / counted} for site, count in sites],
        "time": None,
    }
    if split is not None and step_s:
        inside, between = split.inside_s / step_s, (split.between_s or 0.0) / step_s
        detail["time"] = inside + between
        detail["inside_step"] = inside
        # Its idle time between steps, in % of the step: None where the agent did not split it.
        detail["between_steps"] = None if split.between_s is None else between
        detail["host_blocked_ms"] = _ms(split.blocked_s)
        # Of the part inside the step, the idle inside the syncs' loops (null where not split).
        detail["loop_ms"] = _ms(split.loop_s)
        for entry, (_, count) in zip(detail["sites"], sites, strict=True):
            # Each site's share of the sync time by its share of the syncs: estimated.
            entry["share_of_time"] = count / total if total else None
            entry["fix"] = f"at {entry['site']}: {SYNC_FIX.split(': ', 1)[1]}"
        if split.blocked_s is not None:
            source = (
                f"{per_iter:.3g} syncs/iteration; the GPU's idle time that the host's {split.blocked_s * 1e3:.3g} ms "
                f"blocked in them would have let it run ahead into (at most that), in {_traced(sums)}"
            )
            if split.loop_s:
                source += f"; {split.loop_s * 1e3:.3g} ms of it inside loops of reads that returned at once, whole"
            if split.between_s:
                source += f"; {split.between_s * 1e3:.3g} ms of it between steps, out of the data wait"
        else:
            source = f"{per_iter:.3g} syncs/iteration; the GPU's idle time after them in {_traced(sums)}"
            if split.between_s is None:
                source += "; its idle time between steps not measured (kept in the data wait)"
            else:
                source += (
                    f", and between steps in the gaps they began ({split.between_s * 1e3:.3g} ms a gap, "
                    "out of the data wait)"
                )
        return Term(
            "host_syncs",
            "host synchronizations",
            inside + between,
            ESTIMATED,
            source,
            SYNC_FIX,
            detail,
            between=between,
        )
    if per_iter == 0:
        detail["time"] = 0.0
        return Term("host_syncs", "host synchronizations", 0.0, MEASURED, "no host sync counted", "", detail)
    where = f"{len(sites)} site{'s' * (len(sites) != 1)}"
    source = (
        f"{per_iter:.3g} syncs/iteration at {where}, counted; time: not measured "
        "(sync_backend='cupti' traces a few steps to price them)"
    )
    return Term("host_syncs", "host synchronizations", None, NOT_MEASURED, source, SYNC_FIX, detail)


class IntervalRanks(NamedTuple):
    """One interval's ranks, from the rank summaries kept at ingest (store/rank_summaries.py)."""

    steps: float  # the interval's steps: its last step less the one before it
    ranks: int  # the ranks that sent it
    mean_s: float  # their mean step time
    slowest_s: float  # the slowest one's
    slowest_rank: int | None  # which rank that was (None where its row was not kept)


class RankWaits(NamedTuple):
    """The straggler term's sums over a window's intervals of several ranks with a timed step
    (`rank_waits` of IntervalRanks, or the same sums in SQL: backend/reads/ledger.py)."""

    most_ranks: int  # the most ranks any interval of the window had
    intervals: int  # the intervals of several ranks with steps
    steps: float  # their steps
    slowest_s: float  # Σ steps x the slowest rank's step time
    mean_s: float  # Σ steps x the ranks' mean step time
    waited: dict[int, float]  # Σ steps x (slowest - mean), by the rank that was slowest (where kept)


NO_RANK_WAITS = RankWaits(0, 0, 0.0, 0.0, 0.0, {})


def rank_waits(per_interval: Sequence[IntervalRanks]) -> RankWaits:
    shared = [i for i in per_interval if i.ranks >= 2 and i.steps > 0]
    waited: dict[int, float] = {}  # each slowest rank's share of the waiting (rank-steps x seconds)
    for i in shared:
        if i.slowest_rank is not None:
            waited[i.slowest_rank] = waited.get(i.slowest_rank, 0.0) + i.steps * (i.slowest_s - i.mean_s)
    return RankWaits(
        max((i.ranks for i in per_interval), default=0),
        len(shared),
        sum(i.steps for i in shared),
        sum(i.steps * i.slowest_s for i in shared),
        sum(i.steps * i.mean_s for i in shared),
        waited,
    )


def straggler_term(waits: RankWaits, step_s: float | None) -> Term:
    """The time a rank waits for the slowest, per step, averaged over the ranks: in each interval
    the slowest rank's step time minus the mean of its ranks', weighted by the interval's steps.
    Read from the per-interval rank summaries, so it costs the same at 8 and 16,384 ranks."""
    if waits.most_ranks < 2:
        return Term("stragglers", "stragglers", None, NOT_APPLICABLE, "one rank")
    steps, waited = waits.steps, waits.waited
    if not steps or not step_s:
        return Term("stragglers", "stragglers", None, NOT_MEASURED, "no interval of several ranks has a timed step")
    wait = (waits.slowest_s - waits.mean_s) / steps
    slowest = max(waited, key=lambda r: (waited[r], -r)) if waited else None  # the lowest rank among equals
    slowest_ms = waits.slowest_s / steps * 1e3
    mean_ms = waits.mean_s / steps * 1e3
    n = waits.intervals
    source = (
        f"each interval's slowest rank's step time minus its ranks' mean ({slowest_ms:.4g} against {mean_ms:.4g} ms "
        f"over {n} interval{'s' * (n != 1)}), from the ranks' events"
    )
    fix = (
        f"look at rank {slowest}: its data, its GPU's clocks, or balance the tokens per rank"
        if slowest is not None
        else "balance the tokens per rank"
    )
    total_wait = sum(waited.values())
    detail = {
        "slowest_rank": slowest,
        # Its share of the waiting, where the waiting is named (the slowest rows kept).
        "slowest_rank_share": waited[slowest] / total_wait if slowest is not None and total_wait else None,
        "slowest_ms": slowest_ms,
        "mean_ms": mean_ms,
        "intervals": n,
    }
    return Term("stragglers", "stragglers", wait / step_s, MEASURED, source, fix, detail)


def data_wait_term(sums: Mapping[str, float], step_s: float | None, split: SyncSplit | None) -> Term:
    """The GPU's idle time between consecutive steps, per step: the trainer's host time outside
    the step that the GPU's queue did not cover (a loader it waits for is one cause, any other
    host work between steps another). Outside the event-timed step, so a fraction of it that can
    pass 1 and that the rest does not subtract. Its key stays `data_wait` (the API's, the sums')."""
    fix = (
        "find the host work between steps: a loader the trainer waits for (more DataLoader workers, "
        "pinned memory, a deeper prefetch), or logging, evaluation or preprocessing on the training thread"
    )
    gaps = sums["data_wait_gaps"]
    if not gaps or step_s is None:
        why = "no record of the window has two consecutive steps timed by an agent that measures the gaps"
        return Term("data_wait", BETWEEN_STEPS, None, NOT_MEASURED, why, fix, within_step=False)
    measured = sums["data_wait_s"] / gaps
    to_syncs = split.between_s if split is not None else None
    wait = measured - (to_syncs or 0.0)
    source = (
        f"the GPU idle between a step's end and the next one's begin, over {gaps:.0f} step gaps "
        "(CUDA events; the host clock on the CPU), gaps holding the agent's own work left out; "
        "outside the step: it lengthens each iteration"
    )
    if to_syncs:
        source += f"; less {to_syncs * 1e3:.3g} ms a gap that the host syncs' term takes"
    detail = {"wait_ms": wait * 1e3, "measured_ms": measured * 1e3, "to_host_syncs_ms": _ms(to_syncs)}
    status = ESTIMATED if to_syncs else MEASURED  # the syncs' part is scaled from the traced gaps
    return Term("data_wait", BETWEEN_STEPS, wait / step_s, status, source, fix, detail, within_step=False)


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1e3


def launch_bound_term(sums: Mapping[str, float], split: SyncSplit | None, step_s: float | None) -> Term:
    """The GPU's idle time inside the traced steps that the host syncs' time does not take
    (`sync_split`): the host was too slow to launch (estimated from the traced steps)."""
    fix = "CUDA graphs or torch.compile to cut the host's launches, or larger micro-batches"
    traced = sums["traced_step_time_s"]
    if traced <= 0:
        return Term(
            "launch_bound", "host-/launch-bound steps", None, NOT_MEASURED,
            "needs a CUPTI activity trace of some steps (sync_backend='cupti' on a GPU)", fix,
        )  # fmt: skip
    share = split.launch_s / step_s if split is not None and step_s else sums["launch_idle_s"] / traced
    detail = {"busy_share": sums["traced_busy_s"] / traced, "traced_steps": sums["traced_steps"]}
    source = f"the GPU's idle time inside the steps that the host syncs' term does not take, in {_traced(sums)}"
    return Term("launch_bound", "host-/launch-bound steps", share, ESTIMATED, source, fix, detail)


def remainder_term(useful: Term, losses: Sequence[Term]) -> Term:
    """What the named terms leave of the step: 1 - useful - the losses (kernel efficiency),
    only where every loss has a value (a loss not measured would hide in it)."""
    fix = "kernel efficiency: fused kernels (FlashAttention, torch.compile), shapes that fill the tensor cores"
    within = [t for t in losses if t.within_step]
    missing = [t.label for t in within if t.fraction is None and t.status != NOT_APPLICABLE]
    if useful.fraction is None:
        missing.insert(0, useful.label)
    if missing:
        return Term("remainder", "the rest (kernel efficiency)", None, NOT_MEASURED, f"needs {', '.join(missing)}", fix)
    rest = 1.0 - useful.fraction - sum(t.in_step for t in within)  # type: ignore[operator]
    return Term("remainder", "the rest (kernel efficiency)", rest, ESTIMATED, "estimated: the rest", fix)


def overcount_term(sums: Mapping[str, float], c: Coefficients) -> Term:
    """The baseline's over-count: a reporting error, not time; its value is a percent of FLOPs."""
    pct = _metric("overcount_pct", sums, c)
    if pct is None:
        return Term("overcount", "baseline over-count", None, NOT_MEASURED, "no token ran in the window", loss=False)
    return Term(
        "overcount", "baseline over-count", None, MEASURED, METRIC["overcount_pct"].doc,
        "report per-document (THD-corrected) TFLOP/s, not the baseline's",
        {"overcount_pct": pct, "flops": flops_count("bshd", sums, c) - flops_count("thd", sums, c)}, loss=False,
    )  # fmt: skip


def ledger_terms(
    sums: Mapping[str, float],
    c: Coefficients,
    layout: str | None,
    waits: RankWaits,
    sites: Sequence[tuple[str, float]],
) -> list[Term]:
    """The walk of one window: the peak, the losses (the measured ones largest first, then the
    rest in a fixed order), what remains, the useful work."""
    step_s = step_time_s(sums, c)
    useful = useful_term(sums, c)
    split = sync_split(sums, step_s)
    losses = [
        padding_term(sums, c, layout),
        sync_term(sums, c, sites, step_s, split),
        straggler_term(waits, step_s),
        data_wait_term(sums, step_s, split),
        launch_bound_term(sums, split, step_s),
    ]
    losses.append(remainder_term(useful, losses))
    losses.sort(key=lambda t: (t.fraction is None, -(t.fraction or 0.0)))  # stable: unmeasured keep their order
    return [peak_term(sums, c), *losses, useful]


def without_intervals(c: Coefficients, layout: str | None) -> list[Term]:
    """The ledger of a window that holds no interval: every term not measured."""
    terms = ledger_terms(dict.fromkeys(SUM_NAMES, 0.0), c, layout, NO_RANK_WAITS, ())
    return [
        replace(t, fraction=None, status=NOT_MEASURED, source="no interval in the window", detail={}) for t in terms
    ]


def as_time(term: Term, step_s: float | None, gpu_seconds: float) -> dict[str, float | None]:
    """A term's fraction as ms per step, percent of the step and GPU-hours."""
    if term.fraction is None or step_s is None:
        return {"ms_per_step": None, "pct_of_step": None, "gpu_hours": None}
    return {
        "ms_per_step": term.fraction * step_s * 1e3,
        "pct_of_step": 100.0 * term.fraction,
        "gpu_hours": term.fraction * gpu_seconds / 3600.0,
    }


def wait_s(terms: Sequence[Term], step_s: float | None) -> float:
    """The measured time outside the step per iteration (the data wait, and the part of it the
    host syncs took), 0 where not measured."""
    if step_s is None:
        return 0.0
    return sum(t.outside_step * step_s for t in terms)


def gain(
    term: Term, step_s: float | None, outside_s: float, mfu_useful: float | None
) -> dict[str, float | None] | None:
    """What removing a loss would give: the step and the iteration (step + data wait) without its
    time, the useful MFU over the shorter step (the same useful FLOPs in less GPU time; the data
    wait lies outside the GPU time MFU divides by) and the iteration's speed-up in percent."""
    if not term.loss or term.name == "remainder" or term.fraction is None or step_s is None:
        return None
    x = term.fraction * step_s
    step_after = step_s - term.in_step * step_s
    iteration = step_s + outside_s
    return {
        "step_ms_after": step_after * 1e3,
        "iteration_ms_after": (iteration - x) * 1e3,
        "mfu_useful_after": None if mfu_useful is None or step_after <= 0 else mfu_useful * step_s / step_after,
        "speedup_pct": 100.0 * x / iteration if iteration > 0 else None,
    }


def memory_headroom(sums: Mapping[str, float], c: Coefficients, total_bytes: int | None) -> dict[str, Any]:
    """Unused device memory: a hint (a larger micro-batch might use it), not a time term. From
    NVML's memory in use (time-weighted) and the device's total, which the agent reads once."""
    used = _metric("gpu_mem_used_bytes", sums, c)
    if used is None or not total_bytes:
        missing = "the device's total memory" if not total_bytes else "NVML's memory in use"
        return {"status": NOT_MEASURED, "source": f"needs {missing}", "free_pct": None}
    free = max(0.0, 1.0 - used / total_bytes)
    hint = "room for a larger micro-batch (fewer, larger launches; fill the tensor cores)" if free >= 0.25 else ""
    return {
        "status": MEASURED, "source": "NVML memory in use (time-weighted) against the device's total",
        "used_bytes": used, "total_bytes": float(total_bytes), "free_pct": 100.0 * free, "hint": hint,
    }  # fmt: skip
