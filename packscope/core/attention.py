"""Attention by layer kind: what one document (or one pack) adds to each attention sum.

Every sum is in the s²/2 convention of docs/flops.md: the FLOPs coefficient already holds the
factor ½ of the causal mask, so a document of length s under full causal attention "adds s²".
The exact number of (query, key) pairs the model's mask lets through is a little more; the
relation is exact and documented (docs/flops.md, "Exact pairs"):

    full causal:       2·pairs = s² + s
    sliding window W:  2·pairs = window_sq(s, W) + min(s, W)
    chunked, chunk C:  2·pairs = chunk_sq(s, C) + s

Chunks follow transformers' Llama 4 mask (``masking_utils.chunked_overlay`` on the positions
that ``remap_positions_for_packed_sequence`` gives a packed row): a token at position p of its
document is in chunk p // C, positions restart at 0 for each document, so the chunks are aligned
to the document's start and do not depend on where the document sits in its row. A document's
contribution is a function of its length alone, which the agent evaluates elementwise on the
device (``s // C``, ``s % C``, ``minimum(s, W)``; no loop over documents).

Pure Python, like the rest of ``packscope.core``.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

FULL = "full"
SLIDING = "sliding"
CHUNKED = "chunked"
LINEAR = "linear"  # linear attention / state space: per-token cost only, no attention sum
LAYER_KINDS = (FULL, SLIDING, CHUNKED, LINEAR)
ATTENTION_KINDS = (FULL, SLIDING, CHUNKED)  # the kinds that have an attention sum
VIEWS = ("thd", "bshd")


@dataclass(frozen=True)
class AttentionSum:
    """The two names under which one layer kind's sum travels (agent, wire, database)."""

    kind: str
    thd: str  # Σ over real documents
    bshd: str  # Σ over packs, each pack one sequence of its full slot length

    def name(self, view: str) -> str:
        if view not in VIEWS:
            raise ValueError(f"view must be one of {', '.join(VIEWS)}, got {view!r}")
        return self.thd if view == "thd" else self.bshd


# Do not rename: the agent, the wire record and the database carry these names.
ATTENTION_SUMS: dict[str, AttentionSum] = {
    FULL: AttentionSum(FULL, "seqlen_sq_sum_thd", "seqlen_sq_sum_bshd"),
    SLIDING: AttentionSum(SLIDING, "window_sq_sum_thd", "window_sq_sum_bshd"),
    CHUNKED: AttentionSum(CHUNKED, "chunk_sq_sum_thd", "chunk_sq_sum_bshd"),
}
SUM_NAMES: tuple[str, ...] = tuple(name for s in ATTENTION_SUMS.values() for name in (s.thd, s.bshd))


def _length(s: int) -> int:
    if isinstance(s, bool) or not isinstance(s, int) or s < 0:
        raise ValueError(f"a sequence length is an integer >= 0, got {s!r}")
    return s


def _size(value: int, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} is an integer >= 1, got {value!r}")
    return value


def full_sq(s: int) -> int:
    """Full causal attention: s²."""
    return _length(s) ** 2


def window_sq(s: int, window: int) -> int:
    """Sliding window W (each query sees itself and the W - 1 tokens before it, as transformers'
    ``sliding_window_overlay``): s² if s ≤ W, else 2·s·W - W². With m = min(s, W) both cases are
    2·s·m - m², the form to use elementwise."""
    s, w = _length(s), _size(window, "a window")
    m = min(s, w)
    return 2 * s * m - m * m


def chunk_sq(s: int, chunk: int) -> int:
    """Chunked attention, chunks of C aligned to the document's start: Σ over its chunks of c²,
    i.e. (s // C)·C² + (s % C)²."""
    s, c = _length(s), _size(chunk, "a chunk")
    return (s // c) * c * c + (s % c) ** 2


def kind_sq(kind: str, s: int, window: int | None = None, chunk: int | None = None) -> int:
    """What a sequence of length s adds to the sum of ``kind``."""
    if kind == FULL:
        return full_sq(s)
    if kind == SLIDING:
        if window is None:
            raise ValueError("the sliding-window sum needs the window")
        return window_sq(s, window)
    if kind == CHUNKED:
        if chunk is None:
            raise ValueError("the chunked sum needs the chunk size")
        return chunk_sq(s, chunk)
    raise ValueError(f"no attention sum for layer kind {kind!r}; kinds with one: {', '.join(ATTENTION_KINDS)}")


def check_packs(packs: Sequence[Sequence[int]], pack_length: int | None = None) -> int:
    """Validate packs of document lengths; return the slots per pack (default: the largest total)."""
    if not packs:
        raise ValueError("give at least one pack")
    for pack in packs:
        for length in pack:
            if isinstance(length, bool) or not isinstance(length, int) or length <= 0:
                raise ValueError(f"document lengths must be positive integers, got {length!r}")
    totals = [sum(p) for p in packs]
    slots = max(totals) if pack_length is None else pack_length
    if isinstance(slots, bool) or not isinstance(slots, int) or slots <= 0:
        raise ValueError(f"pack length must be positive, got {slots!r}")
    for i, total in enumerate(totals):
        if total > slots:
            raise ValueError(f"pack {i + 1} holds {total} tokens, more than the pack length {slots}")
    return slots


def attention_sums(
    packs: Sequence[Sequence[int]],
    pack_length: int | None = None,
    window: int | None = None,
    chunk: int | None = None,
    kinds: Iterable[str] = ATTENTION_KINDS,
) -> dict[str, int]:
    """The reference for every attention sum of one batch of packs (lists of document lengths).

    THD sums run over the real documents; BSHD sums treat each pack as one sequence of
    ``pack_length`` slots (padding included). Kinds without their size (no window, no chunk) are
    left out.
    """
    slots = check_packs(packs, pack_length)
    out: dict[str, int] = {}
    for kind in kinds:
        if (kind == SLIDING and window is None) or (kind == CHUNKED and chunk is None):
            continue
        names = ATTENTION_SUMS[kind]
        out[names.thd] = sum(kind_sq(kind, s, window, chunk) for pack in packs for s in pack)
        out[names.bshd] = len(packs) * kind_sq(kind, slots, window, chunk)
    return out
