"""A Llama-style decoder, readable top to bottom: RMSNorm, RoPE, GQA, SwiGLU.

The model knows nothing about layouts. It takes token ids [B, L] (BSHD rows, or THD as [1, T]),
position ids of the same shape, and an attention backend (see attention.py) that knows which
tokens may see which. RoPE reads the position ids, which restart at 0 for every document, so a
document inside a pack is encoded exactly as if it were alone.
"""

from __future__ import annotations

import math
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from packscope.trainer.attention import Attention
from packscope.trainer.config import ModelConfig
from packscope.trainer.losses import IGNORE, chunked_cross_entropy


def rope_cos_sin(position_ids: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin [B, L, 1, head_dim / 2] in float32, computed from the positions themselves."""
    inv_freq = theta ** -(torch.arange(0, head_dim, 2, device=position_ids.device, dtype=torch.float32) / head_dim)
    angles = position_ids.float()[..., None] * inv_freq
    return angles.cos()[:, :, None, :], angles.sin()[:, :, None, :]


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate pairs (x_i, x_{i + D/2}) in float32; return the input dtype (bf16 stays bf16)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).type_as(x)


class SelfAttention(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = cfg.heads, cfg.kv_heads, cfg.head_dim
        self.sizes = [cfg.heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim, cfg.kv_heads * cfg.head_dim]
        if cfg.fused_projections:  # one GEMM reads x once for q, k and v
            self.wqkv = nn.Linear(cfg.hidden, sum(self.sizes), bias=False)
        else:
            self.wq = nn.Linear(cfg.hidden, self.sizes[0], bias=False)
            self.wk = nn.Linear(cfg.hidden, self.sizes[1], bias=False)
            self.wv = nn.Linear(cfg.hidden, self.sizes[2], bias=False)
        self.wo = nn.Linear(cfg.heads * cfg.head_dim, cfg.hidden, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: Attention) -> torch.Tensor:
        b, n, _ = x.shape
        if hasattr(self, "wqkv"):
            q, k, v = self.wqkv(x).split(self.sizes, dim=-1)
        else:
            q, k, v = self.wq(x), self.wk(x), self.wv(x)
        q = q.reshape(b, n, self.heads, self.head_dim)
        k = k.reshape(b, n, self.kv_heads, self.head_dim)
        v = v.reshape(b, n, self.kv_heads, self.head_dim)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        return self.wo(attention(q, k, v).reshape(b, n, -1))


class SwiGLU(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if cfg.fused_projections:  # gate and up as one GEMM
            self.w13 = nn.Linear(cfg.hidden, 2 * cfg.ffn, bias=False)
        else:
            self.w1 = nn.Linear(cfg.hidden, cfg.ffn, bias=False)  # gate
            self.w3 = nn.Linear(cfg.hidden, cfg.ffn, bias=False)  # up
        self.w2 = nn.Linear(cfg.ffn, cfg.hidden, bias=False)  # down

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.w13(x).chunk(2, dim=-1) if hasattr(self, "w13") else (self.w1(x), self.w3(x))
        return self.w2(F.silu(gate) * up)


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.attn = SelfAttention(cfg)
        self.mlp_norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.mlp = SwiGLU(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, attention: Attention) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, attention)
        return x + self.mlp(self.mlp_norm(x))


class Transformer(nn.Module):
    rope_cos: torch.Tensor  # buffers, present with max_positions
    rope_sin: torch.Tensor

    def __init__(self, cfg: ModelConfig, max_positions: int | None = None) -> None:
        """``max_positions``: when every position id is below it (the trainer: the pack length),
        RoPE's cos/sin are a table read by position. torch.compile would otherwise recompute
        them (pow, cos, sin per element) inside every layer's fused RoPE kernel, forward and
        backward."""
        super().__init__()
        self.cfg = cfg
        if max_positions is not None:
            cos, sin = rope_cos_sin(torch.arange(max_positions)[None], cfg.head_dim, cfg.rope_theta)
            self.register_buffer("rope_cos", cos[0, :, 0], persistent=False)  # [max_positions, head_dim / 2]
            self.register_buffer("rope_sin", sin[0, :, 0], persistent=False)
        self.embed = nn.Embedding(cfg.vocab, cfg.hidden)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.layers))
        self.norm = nn.RMSNorm(cfg.hidden, eps=cfg.norm_eps)
        self.head = nn.Linear(cfg.hidden, cfg.vocab, bias=False)
        if cfg.tie_embeddings:
            self.head.weight = self.embed.weight
        self._init_weights()

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=0.02)
        # GPT-2: scale the projections that write into the residual stream by depth.
        for block in cast(list[Block], list(self.layers)):
            for proj in (block.attn.wo, block.mlp.w2):
                nn.init.normal_(proj.weight, std=0.02 / math.sqrt(2 * self.cfg.layers))

    def forward(
        self,
        input_ids: torch.Tensor,
        position_ids: torch.Tensor,
        attention: Attention,
        labels: torch.Tensor | None = None,
        chunked_loss: bool = False,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits [B, L, vocab] for token ids and position ids [B, L]; with ``labels``, the
        cross-entropy instead, as (float32 summed loss, detached per-token losses [B * L]).
        The loss is computed here, inside forward, so that wrappers that hook forward (DDP, FSDP)
        see the head's weight used, and so that torch.compile fuses the float32 upcast of the
        logits into the loss. ``chunked_loss`` never holds every token's logits (less memory)."""
        if hasattr(self, "rope_cos"):
            # Clamped: only padding (a static tail, the slots after a pack's last document) can
            # reach max_positions, and padding carries no loss and is seen by no real token.
            at = position_ids.clamp(max=self.rope_cos.shape[0] - 1)
            cos, sin = self.rope_cos[at][:, :, None], self.rope_sin[at][:, :, None]
        else:
            cos, sin = rope_cos_sin(position_ids, self.cfg.head_dim, self.cfg.rope_theta)
        x = self.embed(input_ids)
        for layer in self.layers:
            x = layer(x, cos, sin, attention)
        x = self.norm(x)
        if labels is None:
            return self.head(x)
        if chunked_loss:
            return chunked_cross_entropy(x, self.head.weight, labels)
        token_losses = F.cross_entropy(
            self.head(x).float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE, reduction="none"
        )
        return token_losses.sum(), token_losses.detach()

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())
