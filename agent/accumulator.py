"""Per-interval statistics: cheap to add to on every step, reduced once per logging interval.

Besides the full-causal attention sum (Σ s²) the interval keeps one sum per other layer kind the
model has (packscope.core.attention: a sliding window W, chunks of C), over the real documents on
the device and over the packs (each one sequence of its slot length) on the host.

On a training step the agent keeps the batch as given, with one list append (``batch_forms``:
no device op for any form). At the log boundary everything the interval saw is reduced with a
few dozen ops into one int64 vector, which then travels to the host in a single non-blocking
copy. Values known on the host (token slots, packs, the baseline sums of a fixed shape) never
touch the device. So that an interval of many large per-token batches does not hold all their
tensors, what is held is folded into partial device sums (the same ops, no read) once it passes
FOLD_SLOTS token slots.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from packscope.agent.audio import interval_sums
from packscope.agent.batch_forms import (
    PROBLEMS,
    CuBatch,
    ShapeBatch,
    TokenBatch,
    baseline_packs,
    canonicalize_cu,
    canonicalize_tokens,
    host_table,
)
from packscope.agent.histograms import NUM_BUCKETS, SLOTS, bucket_of, edges_on, slot_of
from packscope.agent.vision import (
    BATCH_KEYS,
    SHAPE_KINDS,
    batch_vision_sums,
    tiles_mask_sums,
    tiles_shape_sums,
    tiles_shapes,
)
from packscope.core.attention import ATTENTION_SUMS, CHUNKED, FULL, SLIDING, SUM_NAMES, chunk_sq, window_sq
from packscope.core.audio_sums import AUDIO_RECORD_SUMS, AnyAudioSpec
from packscope.core.vision import TILES, VISION_SUMS, VISION_TOWERS, VisionSpec

# Layout of the reduced int64 vector: the histograms, then the THD attention sums.
DOC_COUNT = slice(0, SLOTS)
DOC_TOKENS = slice(SLOTS, 2 * SLOTS)
PACK_COUNT = slice(2 * SLOTS, 3 * SLOTS)
PACK_TOKENS = slice(3 * SLOTS, 4 * SLOTS)
# A model with zero-computation experts: the assignments its routers made to real experts
# (agent/routing.py), handed to the interval at its end (add_device_sum).
EXPERT_ASSIGNMENTS = "expert_assignments"
DEVICE_SUMS = (*(names.thd for names in ATTENTION_SUMS.values()), *VISION_SUMS, *AUDIO_RECORD_SUMS, EXPERT_ASSIGNMENTS)
SUM_AT = {name: 4 * SLOTS + i for i, name in enumerate(DEVICE_SUMS)}
# Entries of the interval's cu_seqlens tensors with each of batch_forms.PROBLEMS.
PROBLEM_COUNTS = slice(4 * SLOTS + len(DEVICE_SUMS), 4 * SLOTS + len(DEVICE_SUMS) + len(PROBLEMS))
DEVICE_LEN = PROBLEM_COUNTS.stop
# Token slots of per-token batches (and token masks) held before they are folded into partial
# sums: 4M slots keep about 32 MiB of int64 position ids alive; at 10k tokens a micro-batch that
# is one fold every 400 micro-batches.
FOLD_SLOTS = 1 << 22
# Host statics (then the four host histograms), in the order HostCounts.as_list lays them out.
HOST_FIELDS = ("tokens", "packs", *SUM_NAMES, *VISION_SUMS, *AUDIO_RECORD_SUMS, EXPERT_ASSIGNMENTS)


@dataclass
class HostCounts:
    """What the interval's shapes tell us without looking at the device: the HOST_FIELDS (token
    slots, packs, the baseline's sums, the sums of plain rows and of host-side images) and the
    histograms of plain fixed-length rows (every row one document of row_len tokens)."""

    counts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(HOST_FIELDS, 0))
    doc_hist: list[list[int]] = field(default_factory=lambda: [[0] * NUM_BUCKETS, [0] * NUM_BUCKETS])
    pack_hist: list[list[int]] = field(default_factory=lambda: [[0] * NUM_BUCKETS, [0] * NUM_BUCKETS])

    def add(self, name: str, n: int) -> None:
        self.counts[name] += n

    def as_list(self) -> list[int]:
        """Flat form, in the order ``decode`` reads it."""
        flat = [self.counts[name] for name in HOST_FIELDS]
        for hist in (self.doc_hist, self.pack_hist):
            flat += hist[0] + hist[1]
        return flat


class IntervalAccumulator:
    """`window` / `chunk`: the model's sliding window and attention chunk (ModelSpec.window,
    .chunk), None when it has no such layers (their sums then stay 0, at no cost). `vision` /
    `audio`: its towers (ModelSpec.vision, .audio), None without."""

    def __init__(
        self,
        window: int | None = None,
        chunk: int | None = None,
        vision: VisionSpec | None = None,
        audio: AnyAudioSpec | None = None,
    ) -> None:
        self.window, self.chunk, self.vision, self.audio = window, chunk, vision, audio
        self._vision_tables: dict[str, list[torch.Tensor]] = {}  # device grids / sizes, by batch key
        self._device_sums: dict[str, torch.Tensor] = {}  # counted elsewhere on the device (add_device_sum)
        self._audio_calls: list[tuple[str, torch.Tensor]] = []  # each call's clip mask (or lengths), by reference
        self._tile_masks: list[tuple[torch.Tensor, torch.Tensor]] = []  # mllama's two masks, by reference
        self._cu: list[CuBatch] = []  # counted and canonicalised all together at the log boundary
        self._tokens: list[TokenBatch] = []  # the same for the per-token forms
        self._held_slots = 0  # token slots of the tensors held in _tokens and in cu token masks
        self._partial: torch.Tensor | None = None  # device sums of batches folded before the boundary
        self.host = HostCounts()
        self.kinds: set[str] = set()  # the layouts of the interval's batches (batch_forms' `kind`)
        self._edges: torch.Tensor | None = None

    def add_cu(self, batch: CuBatch) -> None:
        """The hot path of the commonest form: nothing but an append."""
        self._cu.append(batch)
        self.kinds.add(batch.kind)
        if batch.token_mask is not None:
            self._hold(batch.slots)

    def add(self, batch: ShapeBatch | CuBatch | TokenBatch) -> None:
        if isinstance(batch, CuBatch):
            self.add_cu(batch)
            return
        self.kinds.add(batch.kind)
        if isinstance(batch, TokenBatch):
            self._tokens.append(batch)
            self._hold(batch.slots)
            return
        # Every row one full-length document: the host knows it all.
        h = self.host
        self._add_packs(batch.rows, batch.row_len, None)
        self._add_sums(h, "thd", batch.rows, batch.row_len)
        b = bucket_of(batch.row_len)
        for hist in (h.doc_hist, h.pack_hist):
            hist[0][b] += batch.rows
            hist[1][b] += batch.slots

    def _hold(self, slots: int) -> None:
        self._held_slots += slots
        if self._held_slots >= FOLD_SLOTS:
            self._fold(None)

    def add_vision(self, images: Mapping[str, Any]) -> None:
        """A micro-batch's images, under its tower processor's keys (agent/vision.BATCH_KEYS): device
        tables are kept by reference and counted at the boundary; a fixed-size tower's images and
        tables on the CPU are counted now, on the host (neither reads the device)."""
        assert self.vision is not None
        if VISION_TOWERS[self.vision.tower] == TILES:  # the shapes now, the masks kept for the boundary
            shapes = tiles_shapes(self.vision, images)
            if shapes is not None:
                for name, n in tiles_shape_sums(self.vision, shapes).items():
                    self.host.add(name, n)
                self._tile_masks.append((images["aspect_ratio_mask"], images["cross_attention_mask"]))
            return
        for key in BATCH_KEYS[VISION_TOWERS[self.vision.tower]]:
            value = images.get(key)
            if value is None:
                continue
            if isinstance(value, torch.Tensor) and VISION_TOWERS[self.vision.tower] not in SHAPE_KINDS:
                if value.device.type != "cpu":
                    self._vision_tables.setdefault(key, []).append(value)
                    continue
                value = value.tolist()  # on the CPU: no device to wait for
            for name, n in batch_vision_sums(self.vision, {key: value}).items():
                self.host.add(name, int(n))

    def add_device_sum(self, name: str, value: torch.Tensor) -> None:
        """A 0-d device count of one of DEVICE_SUMS made outside the batches (the routing's), added at
        the boundary: kept by reference, nothing read."""
        self._device_sums[name] = value if name not in self._device_sums else self._device_sums[name] + value

    def add_audio(self, key: str, clips: torch.Tensor) -> None:
        """A micro-batch's call of the audio tower: its clips' mask (or lengths) under `key`
        (agent/audio.AUDIO_BATCH_KEYS), kept by reference and counted at the boundary."""
        self._audio_calls.append((key, clips))

    def reduce(self, device: torch.device) -> torch.Tensor:
        """The interval's device statistics as one int64 vector (DEVICE_LEN long); completes
        ``host`` with the held batches' shapes."""
        self._fold(device)
        out = torch.zeros(DEVICE_LEN, dtype=torch.int64, device=device) if self._partial is None else self._partial
        out = out.to(device)
        if self._vision_tables:
            assert self.vision is not None
            for key, parts in self._vision_tables.items():
                # Gemma 4's position tables differ in width (slots) from batch to batch: not concatenated
                tables = [torch.cat(parts)] if parts[0].dim() == 2 else parts
                for table in tables:
                    for name, value in batch_vision_sums(self.vision, {key: table}).items():
                        out[SUM_AT[name]] += value
        for name, value in self._device_sums.items():
            out[SUM_AT[name]] += value.to(device, torch.int64)
        if self._tile_masks:
            assert self.vision is not None
            for tiles_mask, cross in self._tile_masks:
                for name, value in tiles_mask_sums(self.vision, tiles_mask, cross).items():
                    out[SUM_AT[name]] += value.to(device)
        if self._audio_calls:
            assert self.audio is not None
            for name, value in interval_sums(self.audio, self._audio_calls, device).items():
                if isinstance(value, torch.Tensor):
                    out[SUM_AT[name]] += value
                else:  # known from the shapes
                    self.host.add(name, value)
        return out

    def _fold(self, device: torch.device | None) -> None:
        """Count the held batches into the partial sums and let go of their tensors; before the
        boundary (device None) on the device the tensors are on."""
        if not (self._cu or self._tokens):
            return
        if device is None:
            device = _device_of(self._tokens[0]) if self._tokens else self._cu[0].cu.device
        out = torch.zeros(DEVICE_LEN, dtype=torch.int64, device=device) if self._partial is None else self._partial
        out = out.to(device)
        lens, rows, packs = [], [], 0
        whole_rows: list[int] = []  # per pack, in the order the canonical forms number them: 1 = attended whole
        if self._tokens:
            token_lens, token_rows = canonicalize_tokens(self._tokens, 0, device)
            lens.append(token_lens)
            rows.append(token_rows)
            for token_batch in self._tokens:
                self._add_packs(token_batch.rows, token_batch.row_len, token_batch.baseline_pack_length)
                packs += token_batch.rows
            # canonicalize_tokens numbers the packs of position-id batches first, then those of masks alone
            for with_positions in (True, False):
                for token_batch in self._tokens:
                    if (token_batch.position_ids is not None) == with_positions:
                        whole_rows += [int(token_batch.whole_row)] * token_batch.rows
        if self._cu:
            # Their packs are numbered after those of the per-token forms.
            offsets = []
            for b in self._cu:
                offsets.append(packs)
                packs += b.rows
                whole_rows += [int(b.whole_row)] * b.rows
                self._add_packs(b.rows, b.row_len, b.baseline_pack_length)
            cu_lens, cu_rows, problems = canonicalize_cu(self._cu, offsets, device)
            out[PROBLEM_COUNTS] += problems
            lens.append(cu_lens)
            rows.append(cu_rows)
        # Only an interval with such rows pays for them (a model that crosses documents).
        whole = host_table([whole_rows], device)[0] if any(whole_rows) else None
        self._count(out, _cat(lens), _cat(rows), packs, whole)
        self._cu.clear()
        self._tokens.clear()
        self._held_slots = 0

    def _count(
        self, out: torch.Tensor, lens: torch.Tensor, rows: torch.Tensor, packs: int, whole: torch.Tensor | None = None
    ) -> None:
        """Add the histograms and attention sums of documents `lens` in packs `rows` (0..packs-1) to
        `out`, which becomes the partial sums. `whole` (0/1 per pack): packs whose documents the model
        attends across, whose attention sums count the pack as one sequence of its real tokens."""
        if self._edges is None or self._edges.device != out.device:
            self._edges = edges_on(out.device)
        slots = slot_of(lens, self._edges)
        out[DOC_COUNT].index_add_(0, slots, torch.ones_like(lens))
        out[DOC_TOKENS].index_add_(0, slots, lens)
        pack_real = torch.zeros(packs, dtype=torch.int64, device=out.device)
        pack_real.index_add_(0, rows, lens)
        if whole is None:
            self._attention_sums(out, lens)
        else:
            self._attention_sums(out, lens * (1 - whole[rows]))  # documents of whole packs: nothing apart
            self._attention_sums(out, pack_real * whole)
        pack_slots = slot_of(pack_real, self._edges)
        out[PACK_COUNT].index_add_(0, pack_slots, torch.ones_like(pack_real))
        out[PACK_TOKENS].index_add_(0, pack_slots, pack_real)
        self._partial = out

    def _attention_sums(self, out: torch.Tensor, lens: torch.Tensor) -> None:
        """Add the THD attention sums of sequences of lengths `lens` (0: nothing) to `out`."""
        out[SUM_AT[ATTENTION_SUMS[FULL].thd]] += (lens * lens).sum()
        if self.window is not None:  # s² up to the window, then 2·s·W - W² (attention.window_sq)
            shorter = torch.clamp(lens, max=self.window)
            out[SUM_AT[ATTENTION_SUMS[SLIDING].thd]] += (2 * lens * shorter - shorter * shorter).sum()
        if self.chunk is not None:  # whole chunks from each document's start, then the rest (attention.chunk_sq)
            rest = torch.remainder(lens, self.chunk)
            out[SUM_AT[ATTENTION_SUMS[CHUNKED].thd]] += ((lens - rest) * self.chunk + rest * rest).sum()

    def _add_packs(self, rows: int, row_len: int, pack_length: int | None = None) -> None:
        """`rows` packs (or padded rows) of `row_len` slots: their tokens and baseline sums, the
        baseline counting packs of `pack_length` where a packer's is known (batch_forms.baseline_packs)."""
        self.host.add("tokens", rows * row_len)
        self.host.add("packs", rows)
        per_row, length = baseline_packs(row_len, pack_length)
        self._add_sums(self.host, "bshd", rows * per_row, length)

    def _add_sums(self, h: HostCounts, view: str, rows: int, length: int) -> None:
        """The attention sums of `rows` sequences of `length` tokens, known on the host."""
        h.add(ATTENTION_SUMS[FULL].name(view), rows * length * length)
        if self.window is not None:
            h.add(ATTENTION_SUMS[SLIDING].name(view), rows * window_sq(length, self.window))
        if self.chunk is not None:
            h.add(ATTENTION_SUMS[CHUNKED].name(view), rows * chunk_sq(length, self.chunk))


def _cat(tensors: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(tensors) if len(tensors) > 1 else tensors[0]


def _device_of(batch: TokenBatch) -> torch.device:
    tensor = batch.position_ids if batch.position_ids is not None else batch.attention_mask
    assert tensor is not None  # batch_forms gives a TokenBatch one or both
    return tensor.device


def problems(vec: list[int]) -> dict[str, int]:
    """The reduced vector's problem counts (batch_forms.PROBLEMS) that are not zero."""
    return {name: n for name, n in zip(PROBLEMS, vec[PROBLEM_COUNTS], strict=True) if n}


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
        **{names.bshd: h[names.bshd] for names in ATTENTION_SUMS.values()},
        **{name: vec[at] + h[name] for name, at in SUM_AT.items()},  # documents seen on the device and on the host
        "histograms": {"documents": docs, "packs": packs},
    }
