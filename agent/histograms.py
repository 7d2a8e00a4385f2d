"""Fixed log2 length histograms.

Bucket b (0-based) holds lengths in [2^b, 2^(b+1)); the last bucket is open-ended. On the
device we keep one extra leading slot that collects zero-length entries (static padding,
empty documents) so that bucketing needs no boolean mask, which would synchronize.
"""

from __future__ import annotations

import torch

NUM_BUCKETS = 24
EDGES = [1 << b for b in range(NUM_BUCKETS)]  # lower edge of each bucket
SLOTS = NUM_BUCKETS + 1  # device layout: slot 0 = zero length, slot b+1 = bucket b


def edges_on(device: torch.device) -> torch.Tensor:
    # arange runs on the device: no host-to-device copy, hence no sync.
    return torch.pow(2, torch.arange(NUM_BUCKETS, device=device, dtype=torch.int64))


def slot_of(lengths: torch.Tensor, edges: torch.Tensor) -> torch.Tensor:
    """Slot index per length: 0 for length 0, b + 1 for lengths in bucket b."""
    return torch.bucketize(lengths, edges, right=True)


def bucket_of(length: int) -> int:
    """Host-side bucket of a positive length (for static shapes and tests)."""
    if length <= 0:
        raise ValueError(f"length must be positive, got {length}")
    return min(length.bit_length() - 1, NUM_BUCKETS - 1)
