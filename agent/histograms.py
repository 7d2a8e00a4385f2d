"""Log2 length histograms on the device (the edges are packscope.core.histograms').

On the device we keep one extra leading slot that collects zero-length entries (static padding,
empty documents) so that bucketing needs no boolean mask, which would synchronize.
"""

from __future__ import annotations

import functools

import torch

from packscope.core.histograms import NUM_BUCKETS, bucket_of

__all__ = ["NUM_BUCKETS", "SLOTS", "bucket_of", "edges_on", "slot_of"]

SLOTS = NUM_BUCKETS + 1  # device layout: slot 0 = zero length, slot b+1 = bucket b


@functools.cache
def edges_on(device: torch.device) -> torch.Tensor:
    """The bucket edges on `device`, made once per device (each interval's boundary reads them;
    made anew, they were two launches a boundary). Read only: never modify the tensor returned."""
    # arange runs on the device: no host-to-device copy, hence no sync.
    return torch.pow(2, torch.arange(NUM_BUCKETS, device=device, dtype=torch.int64))


def slot_of(lengths: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """Slot index per length: 0 for length 0, b + 1 for lengths in bucket b."""
    return torch.bucketize(lengths, edges, right=True)
