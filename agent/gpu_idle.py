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

Nothing here reads the GPU: the records become CPU tensors (a trace holds thousands), and the
tests feed it synthetic ones.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
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
) -> IdleSplit:
    """Split the GPU time of the traced `steps` (each the host's (begin, end) on CUPTI's clock, in
    order) into busy, idle after a host sync (by site) and other idle, from what ran (`busy`),
    the host's sync calls (`syncs`) and the counter's sites ((time, site), in order).

    The timeline runs from the first busy stretch to the last: the GPU's wait for the first
    launch of the stretch is not inside a traced step's work. Tensor arithmetic over the records
    (a trace holds thousands): Python loops run over the syncs and the sync-caused gaps only."""
    t = _sorted(busy)
    if not len(t):
        return IdleSplit()
    starts, ends = _stretches(t)
    split = IdleSplit(busy_s=int((ends - starts).sum()) / 1e9)
    g0, g1 = ends[:-1], starts[1:]  # the idle gaps
    if not len(g0):
        return split
    windows = torch.tensor([(steps[i][1], steps[i + 1][0]) for i in range(len(steps) - 1)], dtype=torch.int64)
    outside = torch.zeros_like(g0)
    if len(windows):
        lo = torch.maximum(g0[:, None], windows[None, :, 0])
        hi = torch.minimum(g1[:, None], windows[None, :, 1])
        outside = (hi - lo).clamp(min=0).sum(1)
    split.between_steps_s = int(outside.sum()) / 1e9
    inside = (g1 - g0 - outside).clamp(min=0)
    blocked = _blocked_at(g0, g1, t, syncs, tolerance_ns)
    by_sync = (blocked >= 0) & (inside > 0)
    split.sync_idle_s = int(inside[by_sync].sum()) / 1e9
    split.launch_idle_s = int(inside[~by_sync].sum()) / 1e9
    site_times = torch.tensor([at for at, _ in sites], dtype=torch.int64)
    at = torch.searchsorted(site_times, blocked[by_sync] + tolerance_ns, right=True) - 1
    for k, idle in zip(at.tolist(), inside[by_sync].tolist(), strict=True):
        site = sites[k][1] if k >= 0 else UNKNOWN_SITE
        split.sync_sites[site] = split.sync_sites.get(site, 0.0) + idle / 1e9
    return split


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
