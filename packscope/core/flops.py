"""Model FLOPs for packed (THD) and padded (BSHD) batches.

Pure Python on purpose: the backend re-applies the same formula to stored raw sums and must not
import torch. The accounting (see docs/flops.md) is GEMM work only, forward plus backward,
2 FLOPs per multiply-add:

    FLOPs(T, S2) = T * c_lin + S2 * c_core

where T is the number of tokens that drive the linear layers and S2 is the sum over attention
sequences of their squared lengths.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any


def flops(tokens: Any, seqlen_sq_sum: Any, c_lin: Any, c_core: Any) -> Any:
    """FLOPs(T, S2) = T·c_lin + S2·c_core, for ints, floats and SQL expressions alike."""
    return tokens * c_lin + seqlen_sq_sum * c_core


def flops_triad(
    tokens: Any, real_tokens: Any, seqlen_sq_sum_bshd: Any, seqlen_sq_sum_thd: Any, c_lin: Any, c_core: Any
) -> dict[str, Any]:
    """The three counts packscope reports, the one place they are defined (docs/flops.md):

    * ``bshd`` (baseline): every token slot, every pack one dense sequence;
    * ``thd`` (THD-corrected): every token slot, attention over the real documents only;
    * ``useful``: real tokens only, attention over the real documents.
    """
    return {
        "bshd": flops(tokens, seqlen_sq_sum_bshd, c_lin, c_core),
        "thd": flops(tokens, seqlen_sq_sum_thd, c_lin, c_core),
        "useful": flops(real_tokens, seqlen_sq_sum_thd, c_lin, c_core),
    }


@dataclass(frozen=True)
class ModelSpec:
    """What the FLOPs formula needs to know about a decoder-only transformer."""

    layers: int
    hidden: int
    heads: int
    ffn: int
    vocab: int
    kv_heads: int | None = None  # None: no GQA (= heads)
    head_dim: int | None = None  # None: hidden // heads
    gated: bool = True  # SwiGLU/GeGLU: three matrices in the MLP
    vocab_divisor: int = 128  # padded vocabulary granularity (per TP rank)
    tp: int = 1
    # MoE: one flag per decoder layer (1 = MoE MLP); None means a dense model.
    moe_layers: tuple[int, ...] | None = None
    moe_ffn: int | None = None  # expert width, None: = ffn
    moe_topk: int = 0
    moe_shared_ffn: int = 0
    mtp_depth: int = 0
    attn_output_gate: bool = False
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        for key in ("layers", "hidden", "heads", "ffn", "vocab", "vocab_divisor", "tp"):
            if getattr(self, key) <= 0:
                raise ValueError(f"model field {key!r} must be positive, got {getattr(self, key)}")
        if self.kv_heads is not None and self.kv_heads <= 0:
            raise ValueError(f"model field 'kv_heads' must be positive, got {self.kv_heads}")
        if self.head_dim is None and self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) is not divisible by heads ({self.heads}); give head_dim")
        if self.mtp_depth < 0:
            raise ValueError(f"model field 'mtp_depth' must be >= 0, got {self.mtp_depth}")
        if self.moe_layers is not None:
            object.__setattr__(self, "moe_layers", tuple(int(bool(x)) for x in self.moe_layers))
            if len(self.moe_layers) != self.layers:
                raise ValueError(f"moe_layers has {len(self.moe_layers)} entries for {self.layers} layers")
            if any(self.moe_layers) and self.moe_topk <= 0:
                raise ValueError("a model with MoE layers needs moe_topk >= 1")

    # -- derived sizes -------------------------------------------------------------------------
    @property
    def d(self) -> int:
        return self.head_dim if self.head_dim is not None else self.hidden // self.heads

    @property
    def g(self) -> int:
        return self.kv_heads if self.kv_heads is not None else self.heads

    @property
    def padded_vocab(self) -> int:
        step = self.vocab_divisor * self.tp
        return math.ceil(self.vocab / step) * step

    @property
    def total_layers(self) -> int:
        """L' = decoder layers plus MTP layers."""
        return self.layers + self.mtp_depth

    @property
    def moe_layer_count(self) -> int:
        """MoE layers among L'; an MTP layer has the type of the last decoder layer."""
        if not self.moe_layers:
            return 0
        return sum(self.moe_layers) + self.mtp_depth * self.moe_layers[-1]

    # -- the formula ---------------------------------------------------------------------------
    @property
    def c_lin(self) -> int:
        """FLOPs per token of the linear layers (forward + backward)."""
        h, q, k = self.hidden, self.d * self.heads, self.d * self.g
        f = 3 if self.gated else 2
        n_moe = self.moe_layer_count
        n_dense = self.total_layers - n_moe
        attn = h * (q + 2 * k) + q * h + (h * q if self.attn_output_gate else 0)
        moe_width = (self.moe_ffn if self.moe_ffn is not None else self.ffn) * self.moe_topk
        return 6 * (
            self.total_layers * attn
            + h * f * self.ffn * n_dense
            + h * f * (moe_width + self.moe_shared_ffn) * n_moe
            + self.mtp_depth * (3 * h + 2 * h * h)
            + h * self.padded_vocab * (self.mtp_depth + 1)
        )

    @property
    def c_core(self) -> int:
        """FLOPs per unit of S2 (QK^T and P.V, halved for the causal mask, forward + backward)."""
        return 6 * self.total_layers * self.d * self.heads

    def flops(self, tokens: int, seqlen_sq_sum: int) -> int:
        """Exact integer FLOPs for T tokens and S2 = sum of squared sequence lengths."""
        return flops(tokens, seqlen_sq_sum, self.c_lin, self.c_core)

    def triad(self, tokens: int, real_tokens: int, seqlen_sq_sum_bshd: int, seqlen_sq_sum_thd: int) -> dict[str, int]:
        return flops_triad(tokens, real_tokens, seqlen_sq_sum_bshd, seqlen_sq_sum_thd, self.c_lin, self.c_core)

    # -- (de)serialisation for the wire ----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["moe_layers"] = list(self.moe_layers) if self.moe_layers is not None else None
        out.pop("name")
        return out

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelSpec:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown model field(s): {', '.join(sorted(unknown))}")
        return cls(**data)


def moe_layer_pattern(layers: int, freq: int) -> tuple[int, ...]:
    """Megatron's integer ``moe_layer_freq``: layer i is MoE when i % freq == 0 (one in freq)."""
    if freq < 1:
        raise ValueError(f"moe layer frequency must be >= 1, got {freq}")
    return tuple(int(i % freq == 0) for i in range(layers))


@dataclass(frozen=True)
class FlopsBreakdown:
    """The three numbers of one batch (or interval), with the raw sums behind them."""

    tokens: int
    real_tokens: int
    seqlen_sq_sum_bshd: int
    seqlen_sq_sum_thd: int
    flops_bshd: int
    flops_thd: int
    flops_useful: int

    @classmethod
    def compute(
        cls, model: ModelSpec, tokens: int, real_tokens: int, seqlen_sq_sum_bshd: int, seqlen_sq_sum_thd: int
    ) -> FlopsBreakdown:
        triad = model.triad(tokens, real_tokens, seqlen_sq_sum_bshd, seqlen_sq_sum_thd)
        return cls(
            tokens=tokens,
            real_tokens=real_tokens,
            seqlen_sq_sum_bshd=seqlen_sq_sum_bshd,
            seqlen_sq_sum_thd=seqlen_sq_sum_thd,
            flops_bshd=triad["bshd"],
            flops_thd=triad["thd"],
            flops_useful=triad["useful"],
        )


def packs_breakdown(model: ModelSpec, packs: list[list[int]], pack_length: int | None = None) -> FlopsBreakdown:
    """The three numbers for packs given as lists of document lengths (host-side calculator)."""
    if not packs:
        raise ValueError("give at least one pack")
    for pack in packs:
        for length in pack:
            if length <= 0:
                raise ValueError(f"document lengths must be positive, got {length}")
    totals = [sum(p) for p in packs]
    slots = max(totals) if pack_length is None else pack_length
    if slots <= 0:
        raise ValueError(f"pack length must be positive, got {slots}")
    for i, total in enumerate(totals):
        if total > slots:
            raise ValueError(f"pack {i + 1} holds {total} tokens, more than the pack length {slots}")
    return FlopsBreakdown.compute(
        model,
        tokens=slots * len(packs),
        real_tokens=sum(totals),
        seqlen_sq_sum_bshd=len(packs) * slots * slots,
        seqlen_sq_sum_thd=sum(s * s for p in packs for s in p),
    )
