"""LongCat-Flash on the CPU for the tests: a tiny config, the model transformers builds from it, and
the two ways its MoE can run: as transformers runs it (a slot routed to a zero-computation expert
goes through a real expert at weight 0) and as the model prices it (such a slot skipped)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM

_IDS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
# Two layers of two MLA attentions, two dense MLPs and one MoE block each; top-3 of 4 real and 2
# zero-computation experts.
LONGCAT: dict[str, Any] = {
    "model_type": "longcat_flash",
    "hidden_size": 32,
    "num_attention_heads": 4,
    "num_layers": 2,
    "vocab_size": 96,
    "ffn_hidden_size": 48,
    "expert_ffn_hidden_size": 16,
    "n_routed_experts": 4,
    "zero_expert_num": 2,
    "moe_topk": 3,
    "kv_lora_rank": 8,
    "q_lora_rank": 16,
    "qk_nope_head_dim": 8,
    "qk_rope_head_dim": 4,
    "v_head_dim": 8,
    "head_dim": 4,  # the rotary width: qk_rope_head_dim
    **_IDS,
}


def cpu_model(cfg: dict[str, Any] = LONGCAT) -> nn.Module:
    cfg = dict(cfg)
    config = AutoConfig.for_model(cfg.pop("model_type"), **cfg)
    config._attn_implementation = "eager"  # QKᵀ and P·V as matmuls over every (query, key) pair
    config._experts_implementation = "eager"  # one F.linear per expert: ops torch's counter sees
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config)


def _of_class(model: nn.Module, name: str) -> list[nn.Module]:
    return [m for m in model.modules() if type(m).__name__ == name]


@contextlib.contextmanager
def real_assignments(model: nn.Module) -> Iterator[list[torch.Tensor]]:
    """The routers' own outputs, as each forward makes them: per MoE block, its slots whose expert
    index is a real expert (below n_routed_experts)."""
    found: list[torch.Tensor] = []
    real = model.config.n_routed_experts

    def hook(module: nn.Module, args: Any, out: Any) -> None:
        found.append((out[2] < real).sum())

    handles = [m.register_forward_hook(hook) for m in _of_class(model, "LongcatFlashTopkRouter")]
    try:
        yield found
    finally:
        for h in handles:
            h.remove()


@contextlib.contextmanager
def zero_experts_skipped(model: nn.Module) -> Iterator[None]:
    """The MoE as the model prices it: transformers sends a slot routed to a zero-computation expert
    to a real expert at weight 0 (LongcatFlashMoE's dummy indices); here such a slot gets the index
    the experts' own forward skips (num_experts), so only real assignments run a GEMM."""

    def pre(module: nn.Module, args: Any) -> Any:
        hidden, index, weights = args
        return hidden, torch.where(weights == 0, module.num_experts, index), weights

    handles = [m.register_forward_pre_hook(pre) for m in _of_class(model, "LongcatFlashExperts")]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
