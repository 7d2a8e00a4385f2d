"""Causal attention backends. Each is built once per micro-batch and called by every layer with
q [B, L, H, D] and k, v [B, L, H_kv, D]; it returns [B, L, H, D].

* ``CausalAttention``: BSHD, one document per row, SDPA with ``is_causal``.
* ``VarlenAttention``: THD on CUDA, FlashAttention varlen through ``torch.nn.attention.varlen``.
* ``DocumentMaskedAttention``: THD anywhere (CPU, and the tests' oracle), SDPA with a
  block-diagonal causal mask per pack. It costs packs x L^2 memory, so it is not for long packs
  on a GPU.

Each takes an optional sliding ``window`` W: a token attends to itself and the W - 1 tokens
before it (in its document), as Mistral's and Gemma's windowed layers do.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F

from packscope.trainer.packing import Batch

try:
    from torch.nn.attention.varlen import varlen_attn
except ImportError:  # torch < 2.10
    varlen_attn = None  # type: ignore[assignment]

Attention = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]

if varlen_attn is not None:
    _VARLEN_PARAMS = inspect.signature(varlen_attn).parameters
    # torch 2.10 took is_causal; 2.11 and later express causality as the window (-1, 0).
    _CAUSAL: dict[str, Any] = {"window_size": (-1, 0)} if "window_size" in _VARLEN_PARAMS else {"is_causal": True}
    _NATIVE_GQA = "enable_gqa" in _VARLEN_PARAMS


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **kwargs) -> torch.Tensor:
    """SDPA on [B, L, H, D] tensors (it wants [B, H, L, D])."""
    out = F.scaled_dot_product_attention(
        q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), enable_gqa=True, **kwargs
    )
    return out.transpose(1, 2)


def _within(offsets: torch.Tensor, window: int | None) -> torch.Tensor:
    """The causal (and, with a window, banded) part of a mask from query - key offsets."""
    allowed = offsets >= 0
    return allowed if window is None else allowed & (offsets < window)


class CausalAttention:
    """Right padding needs no mask: causality already keeps real tokens from seeing it."""

    def __init__(self, window: int | None = None) -> None:
        self.window = window

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        if self.window is None:
            return _sdpa(q, k, v, is_causal=True)
        pos = torch.arange(q.shape[1], device=q.device)
        return _sdpa(q, k, v, attn_mask=_within(pos[:, None] - pos[None, :], self.window))


class DocumentMaskedAttention:
    """A token attends to earlier tokens of its own span in the flat [1, T] stream.

    With ``pack_length`` (spans never cross packs, as the THD packer guarantees) the stream is
    cut into packs and each pack gets its own mask: packs x L^2 work instead of T^2.
    """

    def __init__(
        self, cu_seqlens: torch.Tensor, total: int, pack_length: int | None = None, window: int | None = None
    ) -> None:
        lengths = (cu_seqlens[1:] - cu_seqlens[:-1]).long()
        span = torch.arange(len(lengths), device=cu_seqlens.device)
        # output_size keeps repeat_interleave from reading the total back from the device.
        doc = torch.repeat_interleave(span, lengths, output_size=total)
        self.packs = total // pack_length if pack_length else 1
        doc = doc.view(self.packs, total // self.packs)
        pos = torch.arange(doc.shape[1], device=cu_seqlens.device)
        causal = _within(pos[:, None] - pos[None, :], window)  # within one document, the offset is its own
        # [packs, 1, L, L]: one mask per pack, shared by every head.
        self.mask = ((doc[:, :, None] == doc[:, None, :]) & causal).unsqueeze(1)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        def per_pack(t: torch.Tensor) -> torch.Tensor:
            return t.reshape(self.packs, -1, *t.shape[2:])

        out = _sdpa(per_pack(q), per_pack(k), per_pack(v), attn_mask=self.mask)
        return out.reshape(q.shape)


class VarlenAttention:
    """FlashAttention over the spans of ``cu_seqlens`` (int32, on the device).

    ``max_seqlen`` is a Python int computed by the packer: reading it from the device would
    synchronize every step. The kernel wants bf16/fp16 inputs.
    """

    def __init__(self, cu_seqlens: torch.Tensor, max_seqlen: int, window: int | None = None) -> None:
        if varlen_attn is None:
            raise RuntimeError(
                f"THD attention on CUDA needs torch.nn.attention.varlen (torch >= 2.10); this is "
                f"torch {torch.__version__}. Upgrade torch, or train with --layout bshd."
            )
        if window is not None and "window_size" not in _VARLEN_PARAMS:
            raise RuntimeError(
                f"sliding-window varlen attention needs torch >= 2.11; this is torch {torch.__version__}"
            )
        self.cu_seqlens = cu_seqlens
        self.max_seqlen = max_seqlen
        # FlashAttention's (left, right) window: W - 1 earlier tokens and none later.
        self.causal = _CAUSAL if window is None else {"window_size": (window - 1, 0)}

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        q, k, v = q[0], k[0], v[0]  # [T, H, D]
        gqa: dict[str, Any] = {}
        if k.shape[1] != q.shape[1]:
            if _NATIVE_GQA:
                gqa["enable_gqa"] = True
            else:
                repeat = q.shape[1] // k.shape[1]
                k, v = k.repeat_interleave(repeat, dim=1), v.repeat_interleave(repeat, dim=1)
        cu, n = self.cu_seqlens, self.max_seqlen
        out = varlen_attn(q, k, v, cu, cu, n, n, **self.causal, **gqa)
        return cast(torch.Tensor, out).unsqueeze(0)  # a tuple only when return_aux is asked for


def attention_for(batch: Batch, device: torch.device, window: int | None = None) -> Attention:
    """The backend for this micro-batch on this device (batch already on ``device``)."""
    if batch.layout == "bshd":
        return CausalAttention(window)
    assert batch.cu_seqlens_padded is not None, "a THD batch carries its boundaries"
    if device.type == "cuda":
        return VarlenAttention(batch.cu_seqlens_padded, batch.max_seqlen, window)
    return DocumentMaskedAttention(batch.cu_seqlens_padded, batch.tokens, batch.pack_length, window)
