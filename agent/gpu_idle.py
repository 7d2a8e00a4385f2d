"""Where the GPU sat idle inside traced steps, and why: a pure function on CUPTI activity records.

The input is one traced stretch of steps, every time on CUPTI's clock (ns): what ran on the GPU
(kernels, copies, memsets), the host's synchronizing calls (CUPTI's synchronization records),
when the sync counter recorded each sync's code site, and when the host began and ended each
traced step. The GPU's busy time is the union of what ran; each idle gap between two busy
stretches is split:

* the part that overlaps the host's time between two steps (a step's end to the next one's
  begin) is *between steps*: the event-timed data wait measures it (agent/timing.py), so it is
  not counted again as idle inside a step. Of it, the part in gaps that a host sync began (the
  GPU drained into the sync before the step's end and idled on past it: a logger's `.item()` at
  the end of the step, then the host's work for the next one) is summed apart, per gap between
  the traced steps, so that the ledger can charge that much of the data wait to the syncs: without
  the sync the host's work between steps would have overlapped the GPU's queue. Gaps that hold
  the agent's own work are left out of it, as the data wait leaves them out. Where the step's
  closing syncs returned with at most a few small kernels after them (`queue_ns`), the step left
  the GPU's queue empty: the idle between it and the next step is the syncs' up to the queue they
  drained (the longest of those waits), even past small work at the step's end (the agent's own
  kernels in `step_end` split the idle gap, so that its later part began with no sync); beyond
  that queue the host's work between steps would have idled the GPU anyway (a launch-bound host);
* the rest is inside a step. It follows a host sync when the host was blocked waiting for the
  GPU as it drained: a synchronization call that began before the gap (within `tolerance_ns`)
  and returned in it, or a device-to-host copy into pageable memory (which the host waits for)
  that ended the busy stretch. The host then had to refill the queue: the idle time is the
  sync's cost, charged to the site the counter recorded last before the sync began;
* and any idle inside a step between one host sync's begin and the next one's (both in that
  step: a region the host spent bracketed by syncs) is the syncs' too, charged to the first
  one's site, where the next sync waited at most `queue_ns` (a few small kernels' worth): the
  host never got ahead of the GPU in the region. After a sync the GPU's queue is empty; when
  the host then runs Python and launches a few small kernels before its next sync (a
  per-document loop reading `.item()` per document), the GPU idles through the whole region,
  not only right after the sync: each sync keeps the host from getting ahead of the GPU, and
  without them that host time would overlap the GPU's other work. A region whose closing sync
  waited longer (the host had built a queue: e.g. a whole forward and backward between a
  step's first sync and its last) is left to the other rules. Over-estimates where the host
  between two syncs would be slower than the GPU anyway (launch-bound with or without them).
  The regions' idle is summed apart too (all of it, after the first read as well), with the
  host's time blocked in the reads that closed them: a loop's fix removes the host's work
  between its reads, which the host's blocked time alone does not price.
* Any other idle gap inside a step is the host failing to launch fast enough: host-/launch-bound.

Apart from the split, the host's own side: how long it sat blocked in those sync calls (and
blocking copies), inside the steps and in the gaps between them. Without the syncs the host
would have had that time to run ahead of the GPU; the ledger prices the syncs with it
(docs/ledger.md: the host syncs' term).

Nothing here reads the GPU: the records become CPU tensors (a trace holds thousands), and the
tests feed it synthetic ones.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import NamedTuple

import torch

UNKNOWN_SITE = "<unknown>"


class Busy(NamedTuple):
    """Something the GPU ran: [start, end) ns; `blocking_copy` for a device-to-host copy into
    pageable host memory (the host waits for it to land). A tuple: thousands of them a trace
    become one tensor at once."""

    start: int
    end: int
    blocking_copy: bool = False


class HostSync(NamedTuple):
    """A host call that waited for the device (stream, event or context synchronize): [start, end) ns."""

    start: int
    end: int


@dataclass
class IdleSplit:
    """The traced steps' GPU time, split (seconds)."""

    busy_s: float = 0.0
    sync_idle_s: float = 0.0
    launch_idle_s: float = 0.0
    between_steps_s: float = 0.0  # measured as the data wait, not counted again
    # Of the time between steps, the part in idle gaps a host sync began, over `traced_gaps` gaps
    # between the traced steps (those holding the agent's own work left out).
    sync_idle_between_s: float = 0.0
    traced_gaps: int = 0
    # The host's time blocked in sync calls and blocking copies (their union), inside the traced
    # steps and in the same `traced_gaps` gaps between them.
    blocked_s: float = 0.0
    blocked_between_s: float = 0.0
    # Of the sync idle, the part inside regions bracketed by syncs (a loop of reads: the host's
    # own work between them, which the loop's fix removes with the reads), and the host's time
    # blocked in the reads that closed those regions (each at most `queue_ns`).
    loop_idle_s: float = 0.0
    loop_blocked_s: float = 0.0
    sync_sites: dict[str, float] = field(default_factory=dict)  # sync idle by the counter's site


def _sorted(busy: Sequence[Busy]) -> torch.Tensor:
    """The timed records as an (n, 3) int64 tensor (start, end, blocking copy), by start then end."""
    t = torch.tensor(busy, dtype=torch.int64).reshape(-1, 3)
    t = t[t[:, 1] > t[:, 0]]
    t = t[torch.sort(t[:, 1], stable=True).indices]
    return t[torch.sort(t[:, 0], stable=True).indices]


def merged(busy: Sequence[Busy]) -> list[tuple[int, int, bool]]:
    """The union of the busy records as disjoint stretches (start, end, ends_with_blocking_copy),
    in order."""
    t = _sorted(busy)
    if not len(t):
        return []
    starts, ends = _stretches(t)
    copies = _copy_ends(t)
    return [(a, b, b in copies) for a, b in zip(starts.tolist(), ends.tolist(), strict=True)]


def _stretches(t: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The busy stretches' starts and ends, from sorted records: a stretch closes at the
    furthest end so far where the next record starts after it."""
    reach = torch.cummax(t[:, 1], 0).values
    new = t[1:, 0] > reach[:-1]
    return torch.cat([t[:1, 0], t[1:, 0][new]]), torch.cat([reach[:-1][new], reach[-1:]])


def _copy_ends(t: torch.Tensor) -> set[int]:
    return set(t[t[:, 2] != 0, 1].tolist())


def attribute_idle(
    busy: Sequence[Busy],
    syncs: Sequence[HostSync],
    sites: Sequence[tuple[int, str]],
    steps: Sequence[tuple[int, int]],
    tolerance_ns: int = 2_000,
    queue_ns: int = 100_000,
    agent_gaps: Collection[int] = (),
) -> IdleSplit:
    """Split the GPU time of the traced `steps` (each the host's (begin, end) on CUPTI's clock, in
    order) into busy, idle after a host sync (by site) and other idle, from what ran (`busy`),
    the host's sync calls (`syncs`) and the counter's sites ((time, site), in order). A region
    between two syncs is the syncs' where the second waited at most `queue_ns` (a few small
    kernels: the host never got ahead of the GPU in between). `agent_gaps`: the gaps between
    steps (k: between steps[k] and steps[k + 1]) in which the agent did its own work, left out
    of the syncs' time between steps.

    The timeline runs from the first busy stretch to the last: the GPU's wait for the first
    launch of the stretch is not inside a traced step's work. Tensor arithmetic over the records
    (a trace holds thousands): Python loops run over the syncs and the sites charged only."""
    counted = [k for k in range(len(steps) - 1) if k not in agent_gaps]  # the gaps between steps
    t = _sorted(busy)
    waits = _host_waits(t, syncs)
    inside_ns, between_ns = _host_blocked(waits, steps, counted)
    split = IdleSplit(traced_gaps=len(counted), blocked_s=inside_ns / 1e9, blocked_between_s=between_ns / 1e9)
    if not len(t):
        return split
    starts, ends = _stretches(t)
    split.busy_s = int((ends - starts).sum()) / 1e9
    g0, g1 = ends[:-1], starts[1:]  # the idle gaps
    if not len(g0):
        return split
    windows = torch.tensor([(steps[i][1], steps[i + 1][0]) for i in range(len(steps) - 1)], dtype=torch.int64)
    between = torch.zeros((len(g0), len(windows)), dtype=torch.int64)  # each idle gap's part in each window
    if len(windows):
        lo = torch.maximum(g0[:, None], windows[None, :, 0])
        hi = torch.minimum(g1[:, None], windows[None, :, 1])
        between = (hi - lo).clamp(min=0)
    outside = between.sum(1)
    split.between_steps_s = int(outside.sum()) / 1e9
    inside = (g1 - g0 - outside).clamp(min=0)
    blocked = _blocked_at(g0, g1, t, syncs, tolerance_ns)
    began_by_sync = between[blocked >= 0].sum(0)
    drained = _drained_queues(starts, ends, waits, steps, queue_ns)
    by_window = torch.where(drained >= 0, torch.minimum(between.sum(0), drained), began_by_sync)
    split.sync_idle_between_s = int(by_window[counted].sum()) / 1e9
    by_sync = (blocked >= 0) & (inside > 0)
    site_times = torch.tensor([at for at, _ in sites], dtype=torch.int64)

    def charge(began: torch.Tensor, idle: torch.Tensor) -> None:
        """Idle time (ns) of syncs that began at `began`, to the sites recorded before them."""
        at = torch.searchsorted(site_times, began + tolerance_ns, right=True) - 1
        for k, ns in zip(at.tolist(), idle.tolist(), strict=True):
            if ns > 0:
                site = sites[k][1] if k >= 0 else UNKNOWN_SITE
                split.sync_sites[site] = split.sync_sites.get(site, 0.0) + ns / 1e9

    charge(blocked[by_sync], inside[by_sync])
    # The other gaps' parts inside regions bracketed by syncs (regions lie inside steps, so no
    # part between steps; both sets are disjoint and sorted: one searchsorted each way).
    regions = _bracketed(waits, steps, queue_ns)
    sync_ns = torch.where(by_sync, inside, torch.zeros_like(inside))
    if len(regions):
        r0, r1 = regions[:, 1].contiguous(), regions[:, 2].contiguous()
        overlap = _below(r0, r1, g1) - _below(r0, r1, g0)
        split.loop_idle_s = int(overlap.sum()) / 1e9
        split.loop_blocked_s = int(regions[:, 3].sum()) / 1e9
        in_regions = torch.where(by_sync, 0, overlap)
        sync_ns = sync_ns + in_regions
        free0, free1 = g0[~by_sync], g1[~by_sync]
        charge(regions[:, 0], _below(free0, free1, r1) - _below(free0, free1, r0))
    split.sync_idle_s = int(sync_ns.sum()) / 1e9
    split.launch_idle_s = int((inside - sync_ns).sum()) / 1e9
    return split


def _below(starts: torch.Tensor, ends: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """For each x, how much of the disjoint, sorted intervals [starts, ends) lies before it."""
    if not len(starts):
        return torch.zeros_like(x)
    before = torch.cat([torch.zeros(1, dtype=torch.int64), torch.cumsum(ends - starts, 0)])
    k = torch.searchsorted(starts, x, right=True)  # intervals starting at or before x
    last = (k - 1).clamp(min=0)
    partial = (torch.minimum(x, ends[last]) - starts[last]).clamp(min=0)
    return torch.where(k > 0, before[last] + partial, 0)


def _host_waits(t: torch.Tensor, syncs: Sequence[HostSync]) -> list[tuple[int, int]]:
    """The host's waits for the device, (begin, end) ns: its sync calls and its blocking copies
    (a copy into pageable memory: its wait is not known, so its own duration stands for it)."""
    return [(s.start, s.end) for s in syncs] + [(a, b) for a, b in t[t[:, 2] != 0, :2].tolist()]


def _host_blocked(
    waits: Sequence[tuple[int, int]], steps: Sequence[tuple[int, int]], counted: Sequence[int]
) -> tuple[int, int]:
    """The host's time (ns) inside its `waits`, their union, within the steps and within the
    `counted` gaps between them (k: after steps[k])."""
    union: list[list[int]] = []
    for a, b in sorted(w for w in waits if w[1] > w[0]):
        if union and a <= union[-1][1]:
            union[-1][1] = max(union[-1][1], b)
        else:
            union.append([a, b])
    if not union or not steps:
        return 0, 0
    u = torch.tensor(union, dtype=torch.int64)
    u0, u1 = u[:, 0].contiguous(), u[:, 1].contiguous()
    spans = torch.tensor(list(steps), dtype=torch.int64)
    begins, ends = spans[:, 0].contiguous(), spans[:, 1].contiguous()
    inside = _below(u0, u1, ends) - _below(u0, u1, begins)
    if not counted:
        return int(inside.sum()), 0
    k = torch.tensor(list(counted), dtype=torch.int64)
    between = _below(u0, u1, begins[k + 1]) - _below(u0, u1, ends[k])
    return int(inside.sum()), int(between.clamp(min=0).sum())


def _bracketed(waits: Sequence[tuple[int, int]], steps: Sequence[tuple[int, int]], queue_ns: int) -> torch.Tensor:
    """The host regions bracketed by syncs, as an (n, 4) tensor (first sync's begin, region start,
    region end, the closing sync's wait): from each sync's begin to the next one's, where both
    begin in the same step and the next one found at most `queue_ns` of work queued (it waited no
    longer): the host never got ahead of the GPU in between. The `waits` are `_host_waits`' (a
    blocking copy is a sync too). Disjoint, in order."""
    longest: dict[int, int] = {}  # each begin's longest wait
    for begin, end in waits:
        longest[begin] = max(longest.get(begin, 0), end - begin)
    begins = sorted(longest)
    regions = []
    for begin, end in steps:
        inside = [b for b in begins if begin <= b <= end]
        regions += [(a, a, b, longest[b]) for a, b in pairwise(inside) if longest[b] <= queue_ns]
    return torch.tensor(regions, dtype=torch.int64).reshape(-1, 4)


def _drained_queues(
    starts: torch.Tensor,
    ends: torch.Tensor,
    waits: Sequence[tuple[int, int]],
    steps: Sequence[tuple[int, int]],
    queue_ns: int,
) -> torch.Tensor:
    """Per gap between steps (k: after steps[k]), the queue that step k's closing syncs drained
    (ns), or -1 where it left work queued. A host wait that returned with at most `queue_ns` run
    on the GPU after it before the step's end closed the step with nothing queued; the longest
    such wait is how far ahead of the GPU the host was when it began, so without the syncs the
    host's work between the steps would have overlapped that much queue and no more (on a
    launch-bound host the queue is short, and the idle between steps stays). The `waits` are
    `_host_waits`'."""
    drained = torch.full((max(len(steps) - 1, 0),), -1, dtype=torch.int64)
    for k, (begin, end) in enumerate(steps[:-1]):
        inside = [(a, min(b, end)) for a, b in waits if begin <= a <= end]
        if not inside:
            continue
        returns = torch.tensor([b for _, b in inside] + [end], dtype=torch.int64)
        run_after = _below(starts, ends, returns[-1:]) - _below(starts, ends, returns[:-1])
        closing = [b - a for (a, b), ran in zip(inside, run_after.tolist(), strict=True) if ran <= queue_ns]
        if closing:
            drained[k] = max(closing)
    return drained


def _blocked_at(
    g0: torch.Tensor, g1: torch.Tensor, t: torch.Tensor, syncs: Sequence[HostSync], tolerance_ns: int
) -> torch.Tensor:
    """Per gap, when the host began the wait that left the GPU idle from the gap's start, or -1
    where it was not waiting for the GPU as it drained: a sync that began before the GPU drained
    (within the tolerance: host and device records agree to about a microsecond) and returned in
    the gap or just before it; else a busy stretch that ended with a blocking copy."""
    lows = g0.tolist()
    blocked = [-1] * len(lows)
    if syncs:
        by_end = sorted(syncs, key=lambda s: s.end)
        gaps = torch.searchsorted(g1, torch.tensor([s.end for s in by_end], dtype=torch.int64)).tolist()
        for sync, j in zip(by_end, gaps, strict=True):  # the first gap ending at or after the sync's return
            free = j < len(lows) and blocked[j] < 0
            if free and lows[j] - tolerance_ns <= sync.end and sync.start <= lows[j] + tolerance_ns:
                blocked[j] = sync.start
    out = torch.tensor(blocked, dtype=torch.int64)
    copies = _copy_ends(t)
    if copies:
        after_copy = torch.isin(g0, torch.tensor(sorted(copies), dtype=torch.int64)) & (out < 0)
        out[after_copy] = g0[after_copy]
    return out
