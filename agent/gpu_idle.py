"""Where the GPU sat idle inside traced steps, and why: a pure function on CUPTI activity records.

The input is one traced stretch of steps, every time on CUPTI's clock (ns): what ran on the GPU
(kernels, copies, memsets), the host's synchronizing calls (CUPTI's synchronization records),
when the sync counter recorded each sync's code site, and when the host began and ended each
traced step. The GPU's busy time is the union of what ran; each idle gap between two busy
stretches is split:

* the part that overlaps the host's time between two steps (a step's end to the next one's
  begin) is *between steps*: the event-timed data wait measures it (agent/timing.py), so it is
  left out here and not counted twice;
* the rest is inside a step. It follows a host sync when the host was blocked waiting for the
  GPU as it drained: a synchronization call that began before the gap (within `tolerance_ns`)
  and returned in it, or a device-to-host copy into pageable memory (which the host waits for)
  that ended the busy stretch. The host then had to refill the queue: the idle time is the
  sync's cost, charged to the site the counter recorded last before the sync began. Any other
  idle gap inside a step is the host failing to launch fast enough: host-/launch-bound.

Nothing here reads the GPU or imports torch: the tests feed it synthetic records.
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

UNKNOWN_SITE = "<unknown>"


@dataclass(frozen=True)
class Busy:
    """Something the GPU ran: [start, end) ns; `blocking_copy` for a device-to-host copy into
    pageable host memory (the host waits for it to land)."""

    start: int
    end: int
    blocking_copy: bool = False


@dataclass(frozen=True)
class HostSync:
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
    sync_sites: dict[str, float] = field(default_factory=dict)  # sync idle by the counter's site


def merged(busy: Iterable[Busy]) -> list[tuple[int, int, bool]]:
    """The union of the busy records as disjoint stretches (start, end, ends_with_blocking_copy),
    in order."""
    out: list[list] = []
    for b in sorted(busy, key=lambda b: (b.start, b.end)):
        if b.end <= b.start:
            continue
        if out and b.start <= out[-1][1]:
            if b.end >= out[-1][1]:
                out[-1][1], out[-1][2] = b.end, b.blocking_copy or (b.end == out[-1][1] and out[-1][2])
            continue
        out.append([b.start, b.end, b.blocking_copy])
    return [(s, e, copy) for s, e, copy in out]


def _overlap(lo: int, hi: int, spans: Sequence[tuple[int, int]]) -> int:
    return sum(max(0, min(hi, b) - max(lo, a)) for a, b in spans)


def attribute_idle(
    busy: Iterable[Busy],
    syncs: Iterable[HostSync],
    sites: Sequence[tuple[int, str]],
    steps: Sequence[tuple[int, int]],
    tolerance_ns: int = 2_000,
) -> IdleSplit:
    """Split the GPU time of the traced `steps` (each the host's (begin, end) on CUPTI's clock, in
    order) into busy, idle after a host sync (by site) and other idle, from what ran (`busy`),
    the host's sync calls (`syncs`) and the counter's sites ((time, site), in order).

    The timeline runs from the first busy stretch to the last: the GPU's wait for the first
    launch of the stretch is not inside a traced step's work."""
    stretches = merged(busy)
    split = IdleSplit(busy_s=sum(e - s for s, e, _ in stretches) / 1e9)
    between = [(steps[i][1], steps[i + 1][0]) for i in range(len(steps) - 1)]
    sync_list = sorted(syncs, key=lambda s: s.end)
    sync_ends = [s.end for s in sync_list]
    site_times = [t for t, _ in sites]
    for (_, gap_start, after_copy), (gap_end, _, _) in itertools.pairwise(stretches):
        idle = gap_end - gap_start
        outside = _overlap(gap_start, gap_end, between)
        split.between_steps_s += outside / 1e9
        inside = (idle - outside) / 1e9
        if inside <= 0:
            continue
        blocked_at = _blocked_at(gap_start, gap_end, after_copy, sync_list, sync_ends, tolerance_ns)
        if blocked_at is None:
            split.launch_idle_s += inside
            continue
        split.sync_idle_s += inside
        at = bisect.bisect_right(site_times, blocked_at + tolerance_ns) - 1
        site = sites[at][1] if at >= 0 else UNKNOWN_SITE
        split.sync_sites[site] = split.sync_sites.get(site, 0.0) + inside
    return split


def _blocked_at(
    gap_start: int,
    gap_end: int,
    after_copy: bool,
    syncs: Sequence[HostSync],
    sync_ends: Sequence[int],
    tolerance_ns: int,
) -> int | None:
    """When the host began the wait that left the GPU idle from `gap_start`, or None where the
    host was not waiting for the GPU as it drained."""
    # A sync that returned within the gap (or just before it: the clocks of host and device
    # records agree to about a microsecond) and that began before the GPU drained.
    lo = bisect.bisect_left(sync_ends, gap_start - tolerance_ns)
    for sync in syncs[lo:]:  # in order of their ends
        if sync.end > gap_end:
            break
        if sync.start <= gap_start + tolerance_ns:
            return sync.start
    if after_copy:
        return gap_start
    return None
