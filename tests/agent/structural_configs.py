"""Tiny configs, one per model type the structural count reads (same structure as the published
checkpoints: the layer kinds, MoE layout, linear mixers; tiny sizes)."""

from __future__ import annotations

from typing import Any

# Token ids inside the tiny vocabulary (the published ids are not).
_IDS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
_ATTN = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96, **_IDS}
_MOE = {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}

STRUCTURAL: dict[str, dict[str, Any]] = {
    "olmo2": {"model_type": "olmo2", **_ATTN, "num_hidden_layers": 2, "intermediate_size": 48},
    "olmo3": {
        "model_type": "olmo3",
        **_ATTN,
        "num_hidden_layers": 4,
        "intermediate_size": 48,
        "sliding_window": 5,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
    },
    "smollm3": {
        "model_type": "smollm3",
        **_ATTN,
        "num_hidden_layers": 4,
        "intermediate_size": 48,
        "no_rope_layers": [1, 1, 1, 0],
    },
    "phi3": {"model_type": "phi3", **_ATTN, "num_hidden_layers": 2, "intermediate_size": 48},
    "glm4_moe": {
        "model_type": "glm4_moe",
        **_ATTN,
        **_MOE,
        "num_hidden_layers": 3,
        "intermediate_size": 48,
        "first_k_dense_replace": 1,
        "n_shared_experts": 1,
        "head_dim": 16,
        "num_nextn_predict_layers": 0,
    },
    "qwen3_5_text": {
        "model_type": "qwen3_5_text",
        **_ATTN,
        "num_hidden_layers": 4,
        "intermediate_size": 48,
        "head_dim": 8,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
    },
    "qwen3_5_moe_text": {
        "model_type": "qwen3_5_moe_text",
        **_ATTN,
        "num_hidden_layers": 4,
        "head_dim": 8,
        "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "linear_num_key_heads": 2,
        "linear_num_value_heads": 4,
        "linear_key_head_dim": 8,
        "linear_value_head_dim": 8,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "shared_expert_intermediate_size": 24,
    },
    "lfm2": {
        "model_type": "lfm2",
        **_ATTN,
        "num_hidden_layers": 3,
        "intermediate_size": 48,
        "layer_types": ["conv", "full_attention", "conv"],
    },
    "deepseek_v32": {
        "model_type": "deepseek_v32",
        **_ATTN,
        **_MOE,
        "num_key_value_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 48,
        "layer_types": ["indexed_attention"] * 2,
        "first_k_dense_replace": 1,
        "kv_lora_rank": 8,
        "q_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "index_n_heads": 2,
        "index_head_dim": 8,
        "index_topk": 6,
    },
}
