"""Which sums a formula reads: found by evaluating it once on stand-ins that record each read."""

import functools
from typing import Any

from packscope.core.catalogue import FLOAT_OPS, Coefficients, evaluate


class ReadSums(dict[str, Any]):
    """Sums as a formula reads them, each the same stand-in `value`, their names recorded in
    `read`: which sums a formula needs, found by evaluating it once."""

    def __init__(self, value: Any) -> None:
        super().__init__()
        self.value = value
        self.read: set[str] = set()

    def __missing__(self, key: str) -> Any:
        self.read.add(key)
        return self.value


@functools.lru_cache(maxsize=1024)
def sums_read(c: Coefficients) -> frozenset[str]:
    """The SUMS that some metric's formula reads for a run of these coefficients. Which sums a
    formula reads depends on the coefficients alone, never on the values: a FLOPs count skips the
    sums of the layer kinds and vision parts whose coefficient is 0 (flops_by_kind,
    vision_flops). A read that derives every metric needs only these (a text model's series reads
    no window, chunk or vision sum)."""
    reads = ReadSums(1.0)
    evaluate(reads, c, FLOAT_OPS)
    return frozenset(reads.read)
