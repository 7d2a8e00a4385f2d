"""transformers' defaults for the config fields the FLOPs readers use, per model_type.

Copied from the config classes of transformers 5.24 (``models/*/configuration_*.py``: the dataclass
field defaults, and the ``kwargs`` defaults of ``__post_init__`` where a field lives there), so
that ``packscope flops`` needs neither torch nor transformers. A field absent from a config.json
takes this value, as transformers gives it; ``tests/core/test_hf_defaults.py`` compares every entry
with the installed transformers, so a release that changes one fails there, not silently here.
None means transformers derives the value (``head_dim`` → hidden / heads, ``num_key_value_heads``
→ heads) or that the feature is off.
"""

from __future__ import annotations

from typing import Any

_LLAMA_LIKE: dict[str, Any] = {"num_key_value_heads": None, "head_dim": None}
# SigLIP's and CLIP's vision configs default to the same ViT-B shape (their patches differ).
_VIT_B: dict[str, Any] = {
    "hidden_size": 768,
    "intermediate_size": 3072,
    "num_hidden_layers": 12,
    "num_attention_heads": 12,
    "num_channels": 3,
    "image_size": 224,
}
# Qwen2's and Qwen3's configs default to the same 7B shape.
_QWEN_7B: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 22016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
}
# Gemma 2's and Gemma 3's configs default to the same 2B shape.
_GEMMA_2B: dict[str, Any] = {
    "hidden_size": 2304,
    "intermediate_size": 9216,
    "num_hidden_layers": 26,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "head_dim": 256,
    "sliding_window": 4096,
}
_MISTRAL: dict[str, Any] = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": None,
    "sliding_window": 4096,
}

DEFAULTS: dict[str, dict[str, Any]] = {
    "llama": {
        "vocab_size": 32000,
        "hidden_size": 4096,
        "intermediate_size": 11008,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        **_LLAMA_LIKE,
    },
    "mistral": _MISTRAL,
    # MixtralConfig's defaults are MistralConfig's, with experts and no window.
    "mixtral": {**_MISTRAL, "sliding_window": None, "num_experts_per_tok": 2, "num_local_experts": 8},
    "qwen2": {
        **_QWEN_7B,
        "head_dim": None,  # not a Qwen2Config field: the attention takes hidden / heads
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
        "layer_types": None,
    },
    "qwen3": {
        **_QWEN_7B,
        "head_dim": 128,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
        "layer_types": None,
    },
    "qwen2_moe": {
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_key_value_heads": 16,
        "head_dim": None,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 28,
        "layer_types": None,
        "decoder_sparse_step": 1,
        "moe_intermediate_size": 1408,
        "shared_expert_intermediate_size": 5632,
        "num_experts_per_tok": 4,
        "num_experts": 60,
        "mlp_only_layers": None,
    },
    "qwen3_moe": {
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "num_hidden_layers": 24,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": None,
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": None,  # not a Qwen3MoeConfig field
        "decoder_sparse_step": 1,
        "moe_intermediate_size": 768,
        "num_experts_per_tok": 8,
        "num_experts": 128,
        "mlp_only_layers": None,
    },
    "gemma2": {
        "vocab_size": 256000,
        **_GEMMA_2B,
        "sliding_window_size": None,  # a legacy name some checkpoints carry next to sliding_window
        "layer_types": None,
        "use_bidirectional_attention": None,
    },
    "gemma3_text": {
        "vocab_size": 262208,
        **_GEMMA_2B,
        "sliding_window_pattern": 6,  # a kwargs default of Gemma3TextConfig.__post_init__
        "layer_types": None,
        "use_bidirectional_attention": False,
    },
    "gpt_oss": {
        "vocab_size": 201088,
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_hidden_layers": 36,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "sliding_window": 128,
        "layer_types": None,
        "num_local_experts": 128,
        "num_experts_per_tok": 4,
        "experts_per_token": None,  # not a GptOssConfig field; OpenAI's checkpoints repeat the top-k in it
    },
    "llama4_text": {
        "vocab_size": 202048,
        "hidden_size": 5120,
        "intermediate_size": 8192,
        "intermediate_size_mlp": 16384,
        "num_hidden_layers": 48,
        "num_attention_heads": 40,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "num_experts_per_tok": 1,
        "num_local_experts": 16,
        "moe_layers": None,
        "interleave_moe_layer_step": 1,
        "no_rope_layers": None,
        "no_rope_layer_interval": 4,
        "attention_chunk_size": 8192,
        "layer_types": None,
    },
    "deepseek_v3": {
        "vocab_size": 129280,
        "hidden_size": 7168,
        "intermediate_size": 18432,
        "moe_intermediate_size": 2048,
        "num_hidden_layers": 61,
        "num_attention_heads": 128,
        "num_key_value_heads": 128,
        "n_shared_experts": 1,
        "n_routed_experts": 256,
        "kv_lora_rank": 512,
        "q_lora_rank": 1536,
        "qk_rope_head_dim": 64,
        "v_head_dim": 128,
        "qk_nope_head_dim": 128,
        "num_experts_per_tok": 8,
        "first_k_dense_replace": 3,
        "num_mtp_layers": 1,  # alias num_nextn_predict_layers
        "moe_layer_freq": 1,  # not a DeepseekV3Config field (transformers ignores it); DeepSeek's own default
    },
    "qwen2_5_vl_text": {
        "vocab_size": 152064,
        "hidden_size": 8192,
        "intermediate_size": 29568,
        "num_hidden_layers": 80,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": None,  # not a field: the text attention always takes hidden / heads
        "use_sliding_window": False,
        "sliding_window": 4096,
        "max_window_layers": 80,
        "layer_types": None,
    },
    "qwen3_next": {
        "vocab_size": 151936,
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 48,
        "num_attention_heads": 16,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "linear_key_head_dim": 128,
        "linear_value_head_dim": 128,
        "linear_num_key_heads": 16,
        "linear_num_value_heads": 32,
        "linear_conv_kernel_dim": 4,
        "decoder_sparse_step": 1,
        "moe_intermediate_size": 512,
        "shared_expert_intermediate_size": 512,
        "num_experts_per_tok": 10,
        "num_experts": 512,
        "mlp_only_layers": None,
        "layer_types": None,
        "full_attention_interval": 4,  # a kwargs default of Qwen3NextConfig.__post_init__
        "mtp_num_hidden_layers": None,  # not a Qwen3NextConfig field: transformers builds no MTP
    },
    "gpt2": {"vocab_size": 50257, "n_embd": 768, "n_layer": 12, "n_head": 12, "n_inner": None},
}
# Kimi-K2 ships model_type "kimi_k2" with DeepSeek-V3's architecture (DeepseekV3ForCausalLM).
DEFAULTS["kimi_k2"] = DEFAULTS["deepseek_v3"]

# Vision towers (``vision_config``), keyed by their model_type, and the wrappers' own fields that
# the vision readers use (packscope.core.hf_vision), from the same config classes. Compared with
# transformers by tests/core/test_hf_vision_defaults.py.
VISION_DEFAULTS: dict[str, dict[str, Any]] = {
    "qwen2_5_vl_vision": {
        "depth": 32,
        "hidden_size": 3584,
        "intermediate_size": 3420,
        "num_heads": 16,
        "in_channels": 3,
        "patch_size": 14,
        "spatial_merge_size": 2,
        "temporal_patch_size": 2,
        "window_size": 112,
        "out_hidden_size": 3584,
        "fullatt_block_indexes": [7, 15, 23, 31],  # a tuple in the config class
    },
    "siglip_vision_model": {
        **_VIT_B,
        "patch_size": 16,
        "vision_use_head": True,
    },
    "clip_vision_model": {
        **_VIT_B,
        "patch_size": 32,
    },
    "pixtral": {
        "hidden_size": 1024,
        "intermediate_size": 4096,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "num_channels": 3,
        "patch_size": 16,
    },
    "llama4_vision_model": {
        "hidden_size": 768,
        "intermediate_size": 5632,
        "num_hidden_layers": 34,
        "num_attention_heads": 16,
        "num_channels": 3,
        "image_size": 448,
        "patch_size": 14,
        "pixel_shuffle_ratio": 0.5,
        "projector_input_dim": 4096,
        "projector_output_dim": 4096,
        "vision_output_dim": 7680,
    },
}
WRAPPER_DEFAULTS: dict[str, dict[str, Any]] = {
    "gemma3": {"mm_tokens_per_image": 256},
    "llava": {"vision_feature_layer": -2, "vision_feature_select_strategy": "default"},
    "mistral3": {"vision_feature_layer": -1, "spatial_merge_size": 2},
}
