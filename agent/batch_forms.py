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
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ShapeBatch:
    """Plain fixed-length rows: every row is one document of row_len tokens (host facts only)."""

    rows: int  # padded rows (BSHD) in this micro-batch
    row_len: int  # token slots per row

    @property
    def slots(self) -> int:
        return self.rows * self.row_len


def _check_shape(shape: tuple[int, int]) -> tuple[int, int]:
    if len(shape) != 2 or int(shape[0]) < 1 or int(shape[1]) < 1:
        raise ValueError(f"shape must be (rows, row_len) with both >= 1, got {shape!r}")
    return int(shape[0]), int(shape[1])


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

    @property
    def slots(self) -> int:
        return self.rows * self.row_len


def from_cu_seqlens(
    cu_seqlens: torch.Tensor,
    shape: tuple[int, int],
    cu_seqlens_padded: torch.Tensor | None = None,
    token_mask: torch.Tensor | None = None,
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
    if cu_seqlens.dim() != 1 or cu_seqlens.numel() < 1:
        raise ValueError(f"cu_seqlens must be 1-D with at least one entry, got shape {tuple(cu_seqlens.shape)}")
    physical = cu_seqlens
    if cu_seqlens_padded is not None:
        if cu_seqlens_padded.shape != cu_seqlens.shape:
            raise ValueError(
                "cu_seqlens_padded and cu_seqlens must have the same number of entries, got "
                f"{tuple(cu_seqlens_padded.shape)} and {tuple(cu_seqlens.shape)}"
            )
        physical = cu_seqlens_padded
    if token_mask is not None and token_mask.numel() != rows * row_len:
        raise ValueError(f"token_mask has {token_mask.numel()} entries for {rows} x {row_len} token slots")
    return CuBatch(rows, row_len, cu_seqlens, physical, token_mask)


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
) -> tuple[torch.Tensor, torch.Tensor]:
    """Document lengths and global pack rows of many cu_seqlens batches, in about 20 ops
    whatever the number of batches (no per-batch slicing: on a slow host every op counts).

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
    lens = bounds[after] - bounds[first]
    physical = bounds
    if any(b.physical is not b.cu for b in batches):
        physical = torch.cat([b.physical for b in batches]).to(torch.int64)
    starts = physical[first]
    rows = torch.minimum(starts // row_len, last_row) + row_off
    if any(b.token_mask is not None for b in batches):
        # A batch without a mask counts every token as real.
        masks = [
            b.token_mask if b.token_mask is not None else torch.ones(b.slots, dtype=torch.bool, device=device)
            for b in batches
        ]
        mask = torch.cat([m if m.dim() == 1 else m.reshape(-1) for m in masks]).to(torch.int64)
        # Real tokens per sequence as a difference of prefix sums at its boundaries.
        prefix = torch.cat([mask.new_zeros(1), mask.cumsum(0)])
        ends = physical[after]
        real = prefix[torch.minimum(ends, tok_len) + tok_off] - prefix[torch.minimum(starts, tok_len) + tok_off]
        lens = torch.minimum(lens, real)
    return lens, rows


@dataclass
class TokenBatch:
    """A per-token micro-batch (``position_ids`` and/or ``attention_mask``), kept as given until
    the log boundary, where :func:`canonicalize_tokens` counts all of an interval's together.
    The tensors must not be modified in place before the interval ends."""

    rows: int
    row_len: int
    position_ids: torch.Tensor | None  # [rows, row_len]; None: one document per row (BSHD padding)
    attention_mask: torch.Tensor | None  # [rows, row_len], nonzero for real tokens; None: all real

    @property
    def slots(self) -> int:
        return self.rows * self.row_len


def from_position_ids(position_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> TokenBatch:
    """Documents from HF-style position ids that restart at 0 for every document (validated
    here, counted at the log boundary).

    A document ends where the next token's position is 0, the next token is padding, or the row
    ends; its length is the last position + 1. Every row is a pack.
    """
    pos = position_ids if position_ids.dim() == 2 else position_ids.unsqueeze(0)
    if pos.dim() != 2:
        raise ValueError(f"position_ids must be [rows, len] or [len], got shape {tuple(position_ids.shape)}")
    mask = None
    if attention_mask is not None:
        mask = attention_mask if attention_mask.dim() == 2 else attention_mask.unsqueeze(0)
        if mask.shape != pos.shape:
            raise ValueError(
                f"attention_mask shape {tuple(mask.shape)} differs from position_ids shape {tuple(pos.shape)}"
            )
    return TokenBatch(pos.shape[0], pos.shape[1], pos, mask)


def from_attention_mask(attention_mask: torch.Tensor) -> TokenBatch:
    """BSHD padded rows: each row holds one document of ``mask.sum()`` tokens."""
    if attention_mask.dim() != 2:
        raise ValueError(f"attention_mask must be [rows, len], got shape {tuple(attention_mask.shape)}")
    return TokenBatch(attention_mask.shape[0], attention_mask.shape[1], None, attention_mask)


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
    ends[-1] = True
    ends.index_fill_(0, last, True)  # ...or the row ends
    if any(b.attention_mask is not None for b in batches):
        # A batch without a mask counts every token as real.
        masks = [
            b.attention_mask if b.attention_mask is not None else torch.ones(b.slots, dtype=torch.bool, device=device)
            for b in batches
        ]
        mask = _flat(masks, torch.bool, device)
        ends[:-1] |= ~mask[1:]  # ...or the next token is padding; padding itself ends nothing
        ends &= mask
    lens = torch.where(ends, pos + 1, torch.zeros_like(pos))
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
