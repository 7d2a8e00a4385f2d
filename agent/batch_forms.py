"""Turn every accepted batch form into one canonical shape, without a host synchronization.

Whatever the trainer hands us (``cu_seqlens``, a padded/unpadded pair, static padding with
repeated boundaries or a dummy tail marked by a token mask, ``position_ids`` that restart per
document, a BSHD ``attention_mask`` or a plain fixed-length batch), we reduce it to:

* ``doc_lens``: int64 device tensor of real document lengths, where 0 means "not a document"
  (zero-length entries, the dummy tail, non-final tokens in the per-token forms), and
* ``doc_rows``: the row (pack) each entry belongs to,

plus the static shape (rows x row_len), which is known on the host. Only device ops that never
read back are used: no ``.item()``, boolean indexing, ``nonzero`` or ``bincount``.

Every form that has tensors is kept as given and canonicalised at the log boundary, all of an
interval's batches of a kind together, with a fixed number of ops whatever their number: a
training step runs no kernel for them (``canonicalize_cu``, ``canonicalize_tokens``). Only a
plain shape is counted at once, on the host.

Bad input stops at the call that made it where that costs nothing: wrong types, dimensions,
dtypes and sizes (host metadata), and every value of a Python sequence (it is on the host
already). The values of a device tensor cannot be read without a sync, so a decreasing,
out-of-range or inconsistent ``cu_seqlens`` tensor is counted on the device at the log boundary
(``canonicalize_cu``'s problem counts) and reported when the interval's counts reach the host.

Each batch also says which layout it is (``kind``): padded rows (bshd), packed documents (thd),
or packed with static shapes (thd-static: a token mask marks static padding or a dummy tail).
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

# Problems a cu_seqlens tensor can have, counted per entry on the device (canonicalize_cu).
PROBLEMS = ("decreasing", "out_of_range", "inconsistent")
PROBLEM_TEXT = {
    "decreasing": "cu_seqlens decreases (a boundary is smaller than the one before it)",
    "out_of_range": "cu_seqlens (or cu_seqlens_padded) has a boundary below 0 or past the batch's token slots",
    "inconsistent": "cu_seqlens_padded holds a sequence shorter than cu_seqlens says it is",
}


def baseline_packs(row_len: int, pack_length: int | None) -> tuple[int, int]:
    """(packs, length): what the baseline counts as dense sequences for one row of `row_len` slots:
    the row itself, or, with a packer's pack length known, ceil(row_len / pack_length) packs of
    pack_length (a row that flattens several packs, as TRL's packing hands them to the model)."""
    if pack_length is None or row_len <= pack_length:
        return 1, row_len
    return -(-row_len // pack_length), pack_length


def baseline_sq_sum(rows: int, row_len: int, pack_length: int | None) -> int:
    """S2 of the baseline for `rows` rows of `row_len` slots (baseline_packs)."""
    packs, length = baseline_packs(row_len, pack_length)
    return rows * packs * length * length


@dataclass
class ShapeBatch:
    """Plain fixed-length rows: every row is one document of row_len tokens (host facts only)."""

    rows: int  # padded rows (BSHD) in this micro-batch
    row_len: int  # token slots per row
    kind = "bshd"

    @property
    def slots(self) -> int:
        return self.rows * self.row_len

    baseline_pack_length = None  # padded rows: each one sequence for the baseline


def _check_shape(shape: tuple[int, int]) -> tuple[int, int]:
    try:
        rows, row_len = shape
        rows, row_len = int(rows), int(row_len)
    except (TypeError, ValueError):
        raise ValueError(f"shape must be (rows, row_len), two integers, got {shape!r}") from None
    if rows < 1 or row_len < 1:
        raise ValueError(f"shape must be (rows, row_len) with both >= 1, got {shape!r}")
    return rows, row_len


def as_tensor(
    name: str, value: Any, device: torch.device | None, dims: tuple[int, ...], *, integers: bool = True
) -> torch.Tensor:
    """`value` as a tensor of one of `dims` dimensions, or an error naming the argument; with
    `integers`, of an integer (or bool) dtype: boundaries and positions, not masks.

    A Python sequence (list, tuple, range, numpy array) is accepted: it becomes a CPU tensor that
    is copied to `device` from pinned memory, without blocking (a pageable copy would sync).
    """
    if isinstance(value, torch.Tensor):
        tensor = value
    elif isinstance(value, (str, bytes, dict)) or not (isinstance(value, Sequence) or hasattr(value, "__array__")):
        raise TypeError(f"{name} must be a tensor or a sequence of integers, got {type(value).__name__}")
    else:
        try:
            tensor = torch.as_tensor(value)
        except (TypeError, ValueError, RuntimeError) as exc:
            raise TypeError(f"{name} must be a tensor or a sequence of integers: {exc}") from None
        fractional = tensor.dtype.is_floating_point and not bool((tensor == tensor.round()).all())
        if integers and tensor.numel() and fractional:
            raise TypeError(f"{name} must hold whole numbers, got {str(value)[:80]}")
        tensor = tensor.to(torch.int64)
        if device is not None and device.type != "cpu":
            tensor = tensor.pin_memory().to(device, non_blocking=True)
    if tensor.dim() not in dims:
        wanted = " or ".join(f"{d}-D" for d in dims)
        raise ValueError(f"{name} must be {wanted}, got shape {tuple(tensor.shape)}")
    if integers and (tensor.dtype.is_floating_point or tensor.dtype.is_complex):
        raise TypeError(f"{name} must hold integers, got a {tensor.dtype} tensor")
    return tensor


def _is_host(value: Any) -> bool:
    return not isinstance(value, torch.Tensor)


def _check_host_boundaries(name: str, values: list[int], slots: int) -> None:
    """Every value of a Python sequence of boundaries, checked where it is: on the host."""
    for i, (a, b) in enumerate(itertools.pairwise(values)):
        if b < a:
            raise ValueError(f"{name} must not decrease, but entry {i + 1} ({b}) is smaller than entry {i} ({a})")
    low, high = min(values), max(values)
    if low < 0 or high > slots:
        raise ValueError(f"{name} must stay within 0..{slots} (the batch's token slots, from shape), got {low}..{high}")


@dataclass
class CuBatch:
    """A ``cu_seqlens`` micro-batch, kept as given until the log boundary.

    The hot path does no device work for this form: all of an interval's cu_seqlens batches are
    turned into document lengths together, by :func:`canonicalize_cu`, with a fixed number of
    kernels whatever the number of steps. The tensors must not be modified in place before the
    interval ends.
    """

    rows: int
    row_len: int
    cu: torch.Tensor
    physical: torch.Tensor  # where sequences sit (the padded boundaries, else cu itself)
    token_mask: torch.Tensor | None
    pack_length: int | None = None  # the packer's pack length, for the baseline
    # The model attends across the documents of each row (integrations/cross_documents.py): the
    # per-document attention sums count each row as one sequence of its real tokens.
    whole_row: bool = False

    @property
    def slots(self) -> int:
        return self.rows * self.row_len

    @property
    def kind(self) -> str:
        return "thd" if self.token_mask is None else "thd-static"

    @property
    def baseline_pack_length(self) -> int | None:
        return self.pack_length


def from_cu_seqlens(
    cu_seqlens: torch.Tensor | Sequence[int],
    shape: tuple[int, int],
    cu_seqlens_padded: torch.Tensor | Sequence[int] | None = None,
    token_mask: torch.Tensor | Sequence[bool] | None = None,
    *,
    device: torch.device | None = None,
    pack_length: int | None = None,
) -> CuBatch:
    """Documents from cumulative boundaries (validated here, counted at the log boundary).

    ``shape`` is (packs, pack_length): the baseline view treats each pack as one dense sequence.
    With ``cu_seqlens_padded`` (the physical layout, as Transformer Engine takes it) the unpadded
    ``cu_seqlens`` give the lengths and the padded ones place documents in packs. With
    ``token_mask`` (True for real tokens, over the physical layout) a sequence's length is its
    count of real tokens, so a dummy tail that only holds static padding counts as nothing.
    Zero-length entries (repeated boundaries) count as nothing too.
    """
    rows, row_len = _check_shape(shape)
    slots = rows * row_len
    host_cu = list(cu_seqlens) if _is_host(cu_seqlens) else None
    cu = as_tensor("cu_seqlens", cu_seqlens, device, (1,))
    if cu.numel() < 1:
        raise ValueError("cu_seqlens must have at least one entry (the 0 boundary)")
    if host_cu is not None:
        _check_host_boundaries("cu_seqlens", [int(v) for v in host_cu], slots)
    physical = cu
    if cu_seqlens_padded is not None:
        host_padded = list(cu_seqlens_padded) if _is_host(cu_seqlens_padded) else None
        physical = as_tensor("cu_seqlens_padded", cu_seqlens_padded, device, (1,))
        if physical.shape != cu.shape:
            raise ValueError(
                "cu_seqlens_padded and cu_seqlens must have the same number of entries, got "
                f"{tuple(physical.shape)} and {tuple(cu.shape)}"
            )
        if host_padded is not None:
            padded = [int(v) for v in host_padded]
            _check_host_boundaries("cu_seqlens_padded", padded, slots)
            if host_cu is not None:
                _check_padded_pair([int(v) for v in host_cu], padded)
    mask = None if token_mask is None else as_tensor("token_mask", token_mask, device, (1, 2), integers=False)
    if mask is not None and mask.numel() != slots:
        raise ValueError(f"token_mask has {mask.numel()} entries for {rows} x {row_len} token slots (shape)")
    if pack_length is not None and pack_length < 1:
        raise ValueError(f"pack_length must be a positive number of tokens, got {pack_length}")
    return CuBatch(rows, row_len, cu, physical, mask, pack_length)


def _check_padded_pair(cu: list[int], padded: list[int]) -> None:
    for i in range(len(cu) - 1):
        if padded[i + 1] - padded[i] < cu[i + 1] - cu[i]:
            raise ValueError(
                f"cu_seqlens_padded must hold every sequence of cu_seqlens, but sequence {i} is "
                f"{padded[i + 1] - padded[i]} slots there and {cu[i + 1] - cu[i]} tokens in cu_seqlens"
            )


def cu_seqlens_of_packed_seq_params(params: object) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(cu_seqlens, cu_seqlens_padded)`` of an object with Megatron's ``PackedSeqParams`` fields.

    Duck-typed, so that the agent need not import Megatron: ``qkv_format`` must be ``"thd"``
    (Megatron ignores these params otherwise), ``cu_seqlens_q`` holds the real boundaries and
    ``cu_seqlens_q_padded``, when set, the physical ones. ``max_seqlen_q`` is not needed.
    Self-attention only: the key side (``cu_seqlens_kv``) is assumed to equal the query side.
    """
    qkv_format = getattr(params, "qkv_format", "thd")
    if qkv_format != "thd":
        raise ValueError(
            f"packed_seq_params has qkv_format={qkv_format!r}; only 'thd' describes packed documents "
            "(for sbhd/bshd batches pass shape=(rows, seq_len) alone)"
        )
    cu = getattr(params, "cu_seqlens_q", None)
    if not isinstance(cu, torch.Tensor):
        raise ValueError(f"packed_seq_params.cu_seqlens_q must be a tensor, got {type(cu).__name__}")
    padded = getattr(params, "cu_seqlens_q_padded", None)
    return cu, padded if isinstance(padded, torch.Tensor) else None


def host_table(rows: list[list[int]] | list[list[float]], device: torch.device, dtype=torch.int64) -> torch.Tensor:
    """A small table from the host on `device`, by one pinned non-blocking copy (a pageable copy
    would wait for the device)."""
    table = torch.tensor(rows, dtype=dtype)
    if device.type == "cuda":
        table = table.pin_memory()
    return table.to(device, non_blocking=True)


def canonicalize_cu(
    batches: list[CuBatch], row_offsets: list[int], device: torch.device
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Document lengths and global pack rows of many cu_seqlens batches, and the number of entries
    with each of PROBLEMS, in about 30 ops whatever the number of batches (no per-batch slicing:
    on a slow host every op counts).

    Per-batch facts known on the host (entries, row length, first and last row, where its
    tokens start in the concatenated masks, its ordinal) travel in one pinned, non-blocking
    copy and are expanded to one column per entry on the device (repeat_interleave with a
    host-known size).
    """
    table, token_offset = [], 0
    for i, (b, off) in enumerate(zip(batches, row_offsets, strict=True)):
        table.append([b.cu.numel() - 1, b.row_len, off, b.rows - 1, token_offset, b.slots, i])
        token_offset += b.slots
    table_t = host_table(table, device)
    entries = sum(row[0] for row in table)
    meta = torch.repeat_interleave(table_t[:, 1:], table_t[:, 0], dim=0, output_size=entries).T
    row_len, row_off, last_row, tok_off, tok_len, ordinal = meta
    # In the concatenated boundaries, batch i's entry j lies between positions k and k + 1,
    # with k = (entries of the batches before i) + i + j = global entry index + i.
    first = torch.arange(entries, device=device) + ordinal
    after = first + 1
    bounds = torch.cat([b.cu for b in batches]).to(torch.int64)
    # Each entry's boundaries, gathered once: every later use reads these (each op is a launch).
    starts, ends = bounds[first], bounds[after]
    lens = ends - starts
    decreasing = lens < 0
    outside = _outside(starts, ends, tok_len)
    inconsistent = torch.zeros_like(decreasing)
    if any(b.physical is not b.cu for b in batches):
        physical = torch.cat([b.physical for b in batches]).to(torch.int64)
        starts, ends = physical[first], physical[after]
        padded_lens = ends - starts
        decreasing = decreasing | (padded_lens < 0)
        outside = outside | _outside(starts, ends, tok_len)
        inconsistent = padded_lens < lens
    problems = torch.stack([decreasing, outside, inconsistent]).sum(dim=1)
    # Counted, then kept harmless: a negative length would make S2 and the histograms nonsense.
    lens = lens.clamp(min=0)
    rows = torch.minimum(starts // row_len, last_row).clamp(min=0) + row_off
    if any(b.token_mask is not None for b in batches):
        # A batch without a mask counts every token as real.
        masks = [
            b.token_mask if b.token_mask is not None else torch.ones(b.slots, dtype=torch.bool, device=device)
            for b in batches
        ]
        mask = torch.cat([m if m.dim() == 1 else m.reshape(-1) for m in masks]).to(torch.int64)
        # Real tokens per sequence as a difference of prefix sums at its boundaries.
        prefix = torch.cat([mask.new_zeros(1), mask.cumsum(0)])
        at_end = ends.clamp(min=0).minimum(tok_len) + tok_off
        at_start = starts.clamp(min=0).minimum(tok_len) + tok_off
        lens = torch.minimum(lens, (prefix[at_end] - prefix[at_start]).clamp(min=0))
    return lens, rows, problems


def _outside(starts: torch.Tensor, ends: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Per entry: a boundary of it below 0 or past its batch's token slots."""
    return (torch.minimum(starts, ends) < 0) | (ends > slots)


@dataclass
class TokenBatch:
    """A per-token micro-batch (``position_ids`` and/or ``attention_mask``), kept as given until
    the log boundary, where :func:`canonicalize_tokens` counts all of an interval's together.
    The tensors must not be modified in place before the interval ends."""

    rows: int
    row_len: int
    position_ids: torch.Tensor | None  # [rows, row_len]; None: one document per row (BSHD padding)
    attention_mask: torch.Tensor | None  # [rows, row_len], nonzero for real tokens; None: all real
    pack_length: int | None = None  # the packer's pack length, for the baseline (position ids only)
    whole_row: bool = False  # as CuBatch.whole_row (position ids only)

    @property
    def slots(self) -> int:
        return self.rows * self.row_len

    @property
    def kind(self) -> str:
        """The layout: packed documents (position ids restart per document) or padded rows."""
        return "thd" if self.position_ids is not None else "bshd"

    @property
    def baseline_pack_length(self) -> int | None:
        """The pack length the baseline counts: a packer's, for packed rows only."""
        return self.pack_length if self.kind != "bshd" else None


def from_position_ids(
    position_ids: torch.Tensor | Sequence[Any],
    attention_mask: torch.Tensor | Sequence[Any] | None = None,
    *,
    device: torch.device | None = None,
    pack_length: int | None = None,
) -> TokenBatch:
    """Documents from HF-style position ids that restart at 0 for every document (checked here,
    counted at the log boundary).

    A document ends where the next token's position is 0, the next token is padding, or the row
    ends; its length is the last position + 1. Every row is a pack.
    """
    given = as_tensor("position_ids", position_ids, device, (1, 2))
    pos = given if given.dim() == 2 else given.unsqueeze(0)
    if pos.numel() == 0:
        raise ValueError(f"position_ids is empty (shape {tuple(given.shape)})")
    mask = None
    if attention_mask is not None:
        given_mask = as_tensor("attention_mask", attention_mask, device, (1, 2), integers=False)
        mask = given_mask if given_mask.dim() == 2 else given_mask.unsqueeze(0)
        if mask.shape != pos.shape:
            raise ValueError(
                f"attention_mask shape {tuple(mask.shape)} differs from position_ids shape {tuple(pos.shape)}"
            )
    if pack_length is not None and pack_length < 1:
        raise ValueError(f"pack_length must be a positive number of tokens, got {pack_length}")
    return TokenBatch(pos.shape[0], pos.shape[1], pos, mask, pack_length)


def from_attention_mask(
    attention_mask: torch.Tensor | Sequence[Any], *, device: torch.device | None = None
) -> TokenBatch:
    """BSHD padded rows: each row holds one document of ``mask.sum()`` tokens."""
    mask = as_tensor("attention_mask", attention_mask, device, (2,), integers=False)
    if mask.numel() == 0:
        raise ValueError(f"attention_mask is empty (shape {tuple(mask.shape)})")
    return TokenBatch(mask.shape[0], mask.shape[1], None, mask)


def from_shape(shape: tuple[int, int]) -> ShapeBatch:
    """Plain fixed-length BSHD: every row is one full document; nothing to read on the device."""
    rows, row_len = _check_shape(shape)
    return ShapeBatch(rows, row_len)


def canonicalize_tokens(
    batches: list[TokenBatch], row_offset: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """Document lengths and global pack rows (numbered from ``row_offset``) of many per-token
    batches, in about 25 ops whatever their number: the batches are flattened into one token
    axis (views, then one ``cat``), and where the rows end travels from the host in one table.

    position_ids batches give one entry per token (the length at a document's last token, 0
    elsewhere); attention-mask-only batches one entry per row (its count of real tokens).
    """
    lens, rows = [], []
    with_pos = [b for b in batches if b.position_ids is not None]
    masks_only = [b for b in batches if b.position_ids is None]
    if with_pos:
        lens_p, rows_p = _position_lengths(with_pos, row_offset, device)
        lens.append(lens_p)
        rows.append(rows_p)
        row_offset += sum(b.rows for b in with_pos)
    if masks_only:
        lens_m, rows_m = _mask_lengths(masks_only, row_offset, device)
        lens.append(lens_m)
        rows.append(rows_m)
    return (torch.cat(lens), torch.cat(rows)) if len(lens) > 1 else (lens[0], rows[0])


def _flat(tensors: list[torch.Tensor], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    flat = torch.cat([t.reshape(-1) for t in tensors]) if len(tensors) > 1 else tensors[0].reshape(-1)
    return flat.to(device, dtype)


def _row_table(batches: list[TokenBatch], row_offset: int, device: torch.device) -> torch.Tensor:
    """Per row: (index of its last token on the flat axis, its length, its global row number)."""
    table, start, row = [], 0, row_offset
    for b in batches:
        for _ in range(b.rows):
            start += b.row_len
            table.append([start - 1, b.row_len, row])
            row += 1
    return host_table(table, device).T


def _position_lengths(
    batches: list[TokenBatch], row_offset: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    pos = _flat([b.position_ids for b in batches if b.position_ids is not None], torch.int64, device)
    last, row_len, row = _row_table(batches, row_offset, device)
    ends = torch.empty_like(pos, dtype=torch.bool)
    ends[:-1] = pos[1:] == 0  # the next token starts a document...
    # ...or the row ends (the last token among them: no `ends[-1] = True`, a scalar write that
    # synchronizes on CUDA)
    ends.index_fill_(0, last, True)
    if any(b.attention_mask is not None for b in batches):
        # A batch without a mask counts every token as real.
        masks = [
            b.attention_mask if b.attention_mask is not None else torch.ones(b.slots, dtype=torch.bool, device=device)
            for b in batches
        ]
        mask = _flat(masks, torch.bool, device)
        ends[:-1] |= ~mask[1:]  # ...or the next token is padding; padding itself ends nothing
        ends &= mask
    lens = torch.where(ends, pos + 1, torch.zeros_like(pos)).clamp(min=0)  # a negative position counts nothing
    rows = torch.repeat_interleave(row, row_len, output_size=pos.numel())
    return lens, rows


def _mask_lengths(
    batches: list[TokenBatch], row_offset: int, device: torch.device
) -> tuple[torch.Tensor, torch.Tensor]:
    """One document per row, of the row's count of real tokens (prefix sums at the row ends)."""
    mask = _flat([b.attention_mask for b in batches if b.attention_mask is not None], torch.int64, device)
    last, row_len, row = _row_table(batches, row_offset, device)
    prefix = torch.cat([mask.new_zeros(1), mask.ne(0).to(torch.int64).cumsum(0)])
    return prefix[last + 1] - prefix[last + 1 - row_len], row
