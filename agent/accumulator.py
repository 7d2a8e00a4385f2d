"""Per-interval statistics: cheap to add to on every step, reduced once per logging interval.

On a training step the agent keeps the batch as given, with one list append (``batch_forms``:
no device op for any form). At the log boundary everything the interval saw is reduced with a
few dozen ops into one int64 vector, which then travels to the host in a single non-blocking
copy. Values known on the host (token slots, packs, the baseline S2 of a fixed shape) never touch
the device. So that an interval of many large per-token batches does not hold all their tensors,
what is held is folded into partial device sums (the same ops, no read) once it passes
FOLD_SLOTS token slots.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from packscope.agent.batch_forms import CuBatch, ShapeBatch, TokenBatch, canonicalize_cu, canonicalize_tokens
from packscope.agent.histograms import NUM_BUCKETS, SLOTS, bucket_of, edges_on, slot_of

# Layout of the reduced int64 vector.
DOC_COUNT = slice(0, SLOTS)
DOC_TOKENS = slice(SLOTS, 2 * SLOTS)
PACK_COUNT = slice(2 * SLOTS, 3 * SLOTS)
PACK_TOKENS = slice(3 * SLOTS, 4 * SLOTS)
SEQLEN_SQ_SUM_THD = 4 * SLOTS
DEVICE_LEN = 4 * SLOTS + 1
# Host statics (then the four host histograms), in the order HostCounts.as_list lays them out.
HOST_FIELDS = ("tokens", "packs", "seqlen_sq_sum_bshd", "seqlen_sq_sum_thd")
# Token slots of per-token batches (and token masks) held before they are folded into partial
# sums: 4M slots keep about 32 MiB of int64 position ids alive; at 10k tokens a micro-batch that
# is one fold every 400 micro-batches.
FOLD_SLOTS = 1 << 22


@dataclass
class HostCounts:
    """What the interval's shapes tell us without looking at the device."""

    tokens: int = 0
    packs: int = 0
    seqlen_sq_sum_bshd: int = 0
    # Plain fixed-length batches: every row is one document of row_len tokens.
    seqlen_sq_sum_thd: int = 0
    doc_hist: list[list[int]] = field(default_factory=lambda: [[0] * NUM_BUCKETS, [0] * NUM_BUCKETS])
    pack_hist: list[list[int]] = field(default_factory=lambda: [[0] * NUM_BUCKETS, [0] * NUM_BUCKETS])

    def as_list(self) -> list[int]:
        """Flat form, in the order ``decode`` reads it."""
        flat = [getattr(self, name) for name in HOST_FIELDS]
        for hist in (self.doc_hist, self.pack_hist):
            flat += hist[0] + hist[1]
        return flat

    def add_shape(self, batch: CuBatch | TokenBatch | ShapeBatch) -> None:
        self.tokens += batch.slots
        self.packs += batch.rows
        self.seqlen_sq_sum_bshd += batch.rows * batch.row_len * batch.row_len


class IntervalAccumulator:
    def __init__(self) -> None:
        self._cu: list[CuBatch] = []  # counted and canonicalised all together at the log boundary
        self._tokens: list[TokenBatch] = []  # the same for the per-token forms
        self._held_slots = 0  # token slots of the tensors held in _tokens and in cu token masks
        self._partial: torch.Tensor | None = None  # device sums of batches folded before the boundary
        self.host = HostCounts()
        self._edges: torch.Tensor | None = None

    def add_cu(self, batch: CuBatch) -> None:
        """The hot path of the commonest form: nothing but an append."""
        self._cu.append(batch)
        if batch.token_mask is not None:
            self._hold(batch.slots)

    def add(self, batch: ShapeBatch | CuBatch | TokenBatch) -> None:
        if isinstance(batch, CuBatch):
            self.add_cu(batch)
        elif isinstance(batch, TokenBatch):
            self._tokens.append(batch)
            self._hold(batch.slots)
        else:  # every row one full-length document: the host knows it all
            h = self.host
            h.add_shape(batch)
            b = bucket_of(batch.row_len)
            h.seqlen_sq_sum_thd += batch.rows * batch.row_len * batch.row_len
            for hist in (h.doc_hist, h.pack_hist):
                hist[0][b] += batch.rows
                hist[1][b] += batch.slots

    def _hold(self, slots: int) -> None:
        self._held_slots += slots
        if self._held_slots >= FOLD_SLOTS:
            self._fold(None)

    def reduce(self, device: torch.device) -> torch.Tensor:
        """The interval's device statistics as one int64 vector (DEVICE_LEN long); completes
        ``host`` with the held batches' shapes."""
        self._fold(device)
        if self._partial is None:
            return torch.zeros(DEVICE_LEN, dtype=torch.int64, device=device)
        return self._partial.to(device)

    def _fold(self, device: torch.device | None) -> None:
        """Count the held batches into the partial sums and let go of their tensors; before the
        boundary (device None) on the device the tensors are on."""
        if not (self._cu or self._tokens):
            return
        if device is None:
            device = _device_of(self._tokens[0]) if self._tokens else self._cu[0].cu.device
        lens, rows, packs = [], [], 0
        if self._tokens:
            token_lens, token_rows = canonicalize_tokens(self._tokens, 0, device)
            lens.append(token_lens)
            rows.append(token_rows)
            for token_batch in self._tokens:
                self.host.add_shape(token_batch)
                packs += token_batch.rows
        if self._cu:
            # Their packs are numbered after those of the per-token forms.
            offsets = []
            for b in self._cu:
                offsets.append(packs)
                packs += b.rows
                self.host.add_shape(b)
            cu_lens, cu_rows = canonicalize_cu(self._cu, offsets, device)
            lens.append(cu_lens)
            rows.append(cu_rows)
        out = torch.zeros(DEVICE_LEN, dtype=torch.int64, device=device) if self._partial is None else self._partial
        self._count(out.to(device), _cat(lens), _cat(rows), packs)
        self._cu.clear()
        self._tokens.clear()
        self._held_slots = 0

    def _count(self, out: torch.Tensor, lens: torch.Tensor, rows: torch.Tensor, packs: int) -> None:
        """Add the histograms and S2 of documents `lens` in packs `rows` (0..packs-1) into `out`."""
        if self._edges is None or self._edges.device != out.device:
            self._edges = edges_on(out.device)
        slots = slot_of(lens, self._edges)
        out[DOC_COUNT].index_add_(0, slots, torch.ones_like(lens))
        out[DOC_TOKENS].index_add_(0, slots, lens)
        out[SEQLEN_SQ_SUM_THD] += (lens * lens).sum()
        pack_real = torch.zeros(packs, dtype=torch.int64, device=out.device)
        pack_real.index_add_(0, rows, lens)
        pack_slots = slot_of(pack_real, self._edges)
        out[PACK_COUNT].index_add_(0, pack_slots, torch.ones_like(pack_real))
        out[PACK_TOKENS].index_add_(0, pack_slots, pack_real)
        self._partial = out

    def reset(self) -> None:
        self._cu.clear()
        self._tokens.clear()
        self._held_slots = 0
        self._partial = None
        self.host = HostCounts()


def _cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(tensors) if len(tensors) > 1 else tensors[0]


def _device_of(batch: TokenBatch) -> torch.device:
    tensor = batch.position_ids if batch.position_ids is not None else batch.attention_mask
    assert tensor is not None  # batch_forms gives a TokenBatch one or both
    return tensor.device


def decode(vec: list[int], host: list[int]) -> dict:
    """Interval totals from the reduced device vector and the flat host counts."""
    h = dict(zip(HOST_FIELDS, host[: len(HOST_FIELDS)], strict=True))
    n, k = NUM_BUCKETS, len(HOST_FIELDS)
    host_hists = [host[k + i * n : k + (i + 1) * n] for i in range(4)]

    def merged(count: slice, tokens: slice, extra_count: list[int], extra_tokens: list[int]) -> dict:
        # Slot 0 of the device layout holds zero-length entries: dropped.
        return {
            "count": [a + b for a, b in zip(vec[count][1:], extra_count, strict=True)],
            "tokens": [a + b for a, b in zip(vec[tokens][1:], extra_tokens, strict=True)],
        }

    docs = merged(DOC_COUNT, DOC_TOKENS, host_hists[0], host_hists[1])
    packs = merged(PACK_COUNT, PACK_TOKENS, host_hists[2], host_hists[3])
    return {
        "tokens": h["tokens"],
        "packs": h["packs"],
        "real_tokens": sum(docs["tokens"]),
        "documents": sum(docs["count"]),
        "seqlen_sq_sum_bshd": h["seqlen_sq_sum_bshd"],
        "seqlen_sq_sum_thd": vec[SEQLEN_SQ_SUM_THD] + h["seqlen_sq_sum_thd"],
        "histograms": {"documents": docs, "packs": packs},
    }
