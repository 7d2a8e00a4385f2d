"""Fixed log2 length histograms: bucket b holds lengths in [2^b, 2^(b+1)); the last is open-ended.

Fixed edges make histograms additive across ranks, intervals and runs, so the server can sum
them without knowing what the agent saw.
"""

NUM_BUCKETS = 24
EDGES = [1 << b for b in range(NUM_BUCKETS)]  # the lower edge of each bucket
KINDS = ("documents", "packs")  # a pack's length is its real tokens


def bucket_of(length: int) -> int:
    """The bucket of a positive length."""
    if length <= 0:
        raise ValueError(f"length must be positive, got {length}")
    return min(length.bit_length() - 1, NUM_BUCKETS - 1)
