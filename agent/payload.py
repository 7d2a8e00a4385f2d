"""An interval's device values in one int64 tensor, so they reach the host in a single copy.

``pack`` lays out the reduced counts, then the host counts when they were summed on the device
(data parallel), then float64 values (loss, grad norm) as int64 bit patterns; ``unpack`` reads
the host copy back with the same layout. These two functions are the only place the layout is
written.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Layout:
    counts: int  # int64 counts: the reduced device vector, plus host counts when reduced with it
    floats: tuple[str, ...]  # names of the float64 values that follow, in order


def pack(counts: torch.Tensor, floats: dict[str, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, Layout]:
    """One int64 device tensor holding ``counts`` and ``floats``; no host synchronization."""
    layout = Layout(counts=counts.numel(), floats=tuple(floats))
    if not floats:
        return counts, layout
    values = torch.stack([v.to(device=device, dtype=torch.float64).reshape(()) for v in floats.values()])
    return torch.cat([counts, values.view(torch.int64)]), layout


def unpack(host: torch.Tensor, layout: Layout) -> tuple[list[int], dict[str, float]]:
    """(counts, floats by name) from the completed host copy of a packed tensor."""
    counts = host[: layout.counts].tolist()
    floats = host[layout.counts :].view(torch.float64).tolist() if layout.floats else []
    return counts, dict(zip(layout.floats, floats, strict=True))
