"""Tiny random configs, one per supported architecture, with windows and chunks small enough that
packs of a few dozen tokens hold documents both shorter and longer than them."""

from __future__ import annotations

import random
from typing import Any

_ATTN = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96}

TINY: dict[str, dict[str, Any]] = {
    "llama": {"model_type": "llama", **_ATTN, "num_hidden_layers": 2, "intermediate_size": 48},
    "mistral": {"model_type": "mistral", **_ATTN, "num_hidden_layers": 2, "intermediate_size": 48, "sliding_window": 5},
    "mixtral": {
        "model_type": "mixtral",
        **_ATTN,
        "num_hidden_layers": 2,
        "intermediate_size": 24,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 6,
    },
    "qwen2": {
        "model_type": "qwen2",
        **_ATTN,
        "num_hidden_layers": 3,
        "intermediate_size": 48,
        "use_sliding_window": True,
        "sliding_window": 5,
        "max_window_layers": 1,
    },
    "qwen3": {
        "model_type": "qwen3",
        **_ATTN,
        "head_dim": 16,  # not hidden / heads
        "num_hidden_layers": 3,
        "intermediate_size": 48,
        "use_sliding_window": True,
        "sliding_window": 4,
        "max_window_layers": 2,
    },
    "qwen2_moe": {
        "model_type": "qwen2_moe",
        **_ATTN,
        "num_hidden_layers": 4,
        "intermediate_size": 40,
        "use_sliding_window": True,
        "sliding_window": 5,
        "max_window_layers": 3,
        "decoder_sparse_step": 2,
        "mlp_only_layers": [3],
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 24,
    },
    "qwen3_moe": {
        "model_type": "qwen3_moe",
        **_ATTN,
        "head_dim": 8,
        "num_hidden_layers": 2,
        "intermediate_size": 40,
        "use_sliding_window": True,
        "sliding_window": 6,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
    },
    "qwen3_next": {
        "model_type": "qwen3_next",
        **_ATTN,
        "head_dim": 8,
        "num_hidden_layers": 4,
        "full_attention_interval": 2,
        "intermediate_size": 40,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 24,
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 6,
    },
    "gemma2": {
        "model_type": "gemma2",
        **_ATTN,
        "head_dim": 16,
        "num_hidden_layers": 4,
        "intermediate_size": 48,
        "sliding_window": 5,
    },
    "gemma3_text": {
        "model_type": "gemma3_text",
        **_ATTN,
        "head_dim": 16,
        "num_hidden_layers": 7,
        "intermediate_size": 48,
        "sliding_window": 4,
        "sliding_window_pattern": 3,
    },
    "gpt_oss": {
        "model_type": "gpt_oss",
        **_ATTN,
        "head_dim": 8,
        "num_hidden_layers": 4,
        "intermediate_size": 16,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "sliding_window": 3,
    },
    "llama4_text": {
        "model_type": "llama4_text",
        **_ATTN,
        "head_dim": 8,
        "num_hidden_layers": 4,
        "no_rope_layer_interval": 2,
        "attention_chunk_size": 4,
        "interleave_moe_layer_step": 2,
        "num_local_experts": 4,
        "num_experts_per_tok": 1,
        "intermediate_size": 16,
        "intermediate_size_mlp": 40,
    },
    "deepseek_v3": {
        "model_type": "deepseek_v3",
        "hidden_size": 32,
        "num_attention_heads": 4,
        "num_key_value_heads": 4,
        "vocab_size": 96,
        "num_hidden_layers": 3,
        "first_k_dense_replace": 1,
        "intermediate_size": 48,
        "moe_intermediate_size": 16,
        "n_routed_experts": 4,
        "num_experts_per_tok": 2,
        "n_shared_experts": 2,
        "n_group": 1,
        "topk_group": 1,
        "q_lora_rank": 24,
        "kv_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 12,
        "num_nextn_predict_layers": 1,
    },
}
# MLA with a plain q projection (q_lora_rank null, as DeepSeek-V2-Lite), no MTP.
TINY["deepseek_v3_plain_q"] = {**TINY["deepseek_v3"], "q_lora_rank": None, "num_nextn_predict_layers": 0}
_SIGLIP = {
    "model_type": "siglip_vision_model",
    "hidden_size": 16,
    "intermediate_size": 32,
    "num_hidden_layers": 1,
    "num_attention_heads": 2,
    "image_size": 28,
    "patch_size": 14,
}
TINY["gemma3"] = {
    "model_type": "gemma3",
    "text_config": TINY["gemma3_text"],
    "vision_config": _SIGLIP,
    "mm_tokens_per_image": 4,
}
TINY["llama4"] = {
    "model_type": "llama4",
    "text_config": TINY["llama4_text"],
    "vision_config": {
        "model_type": "llama4_vision_model",
        "hidden_size": 16,
        "intermediate_size": 32,
        "num_hidden_layers": 1,
        "num_attention_heads": 2,
        "image_size": 28,
        "patch_size": 14,
        "vision_output_dim": 16,
        "projector_input_dim": 16,
        "projector_output_dim": 16,
    },
}
TINY["qwen2_5_vl"] = {  # flat, as Qwen2.5-VL checkpoints are
    **{k: v for k, v in TINY["qwen2"].items() if k != "model_type"},
    "model_type": "qwen2_5_vl",
    "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]},  # head_dim 8: 4 rotary pairs
    "vision_config": {"depth": 1, "hidden_size": 16, "intermediate_size": 32, "num_heads": 2, "out_hidden_size": 32},
}


def _random_packs(seed: int, count: int, slots: int = 24) -> list[list[int]]:
    """Rows of 1..15-token documents filling ``slots``, drawn with a fixed seed."""
    rng = random.Random(seed)
    packs = []
    for _ in range(count):
        docs: list[int] = []
        while sum(docs) < slots:
            docs.append(min(rng.randint(1, 15), slots - sum(docs)))
        packs.append(docs)
    return packs


# Packed rows: documents shorter and longer than every window (3..6) and chunk (4) above, three
# written out and three drawn at random.
PACKS = [[3, 9, 4], [1, 13], [7, 2, 6], *_random_packs(seed=18, count=3)]
