"""An interval's device values in one int64 tensor, so they reach the host in a single copy.

``pack`` lays out the reduced counts, then float64 values (loss, grad norm: scalars; per-channel
loss sums: a (channels, 2) block) as int64 bit patterns, flattened in order; ``unpack`` reads
the host copy back with the same layout. These two functions are the only place the layout is
written.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Layout:
    counts: int  # int64 counts: the reduced device vector
    floats: tuple[str, ...]  # names of the float64 values that follow, in order
    shapes: tuple[tuple[int, ...], ...] = ()  # their shapes; () is a scalar (the default for all)


def pack(counts: torch.Tensor, floats: dict[str, torch.Tensor], device: torch.device) -> tuple[torch.Tensor, Layout]:
    """One int64 device tensor holding ``counts`` and ``floats`` (tensors of any shape; a
    one-element tensor counts as a scalar); no host synchronization."""
    shapes = tuple(() if v.numel() == 1 else tuple(v.shape) for v in floats.values())
    layout = Layout(counts=counts.numel(), floats=tuple(floats), shapes=shapes)
    if not floats:
        return counts, layout
    values = torch.cat([v.to(device=device, dtype=torch.float64).reshape(-1) for v in floats.values()])
    return torch.cat([counts, values.view(torch.int64)]), layout


def unpack(host: torch.Tensor, layout: Layout) -> tuple[list[int], dict[str, Any]]:
    """(counts, floats by name: a float for a scalar, nested lists for a block) from the
    completed host copy of a packed tensor."""
    counts = host[: layout.counts].tolist()
    values = host[layout.counts :].view(torch.float64)
    shapes = layout.shapes or ((),) * len(layout.floats)
    floats: dict[str, Any] = {}
    offset = 0
    for name, shape in zip(layout.floats, shapes, strict=True):
        size = math.prod(shape)
        floats[name] = values[offset : offset + size].reshape(shape).tolist()
        offset += size
    return counts, floats
