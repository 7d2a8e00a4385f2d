"""Tiny configs, one per model type the structural count reads (same structure as the published
checkpoints: the layer kinds, MoE layout, linear mixers; tiny sizes)."""

from __future__ import annotations

from typing import Any

# Token ids inside the tiny vocabulary (the published ids are not).
_IDS = {"pad_token_id": None, "bos_token_id": None, "eos_token_id": None}
_ATTN = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 96, **_IDS}
_MAMBA = {"mamba_n_heads": 4, "mamba_d_head": 16, "mamba_d_state": 8, "mamba_n_groups": 1, "mamba_expand": 2}
_MOE = {"n_routed_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16}

_GEMMA_LAYERS = {
    "head_dim": 8,
    "num_hidden_layers": 6,
    "sliding_window": 5,
    "layer_types": ["sliding_attention"] * 2 + ["full_attention"] + ["sliding_attention"] * 2 + ["full_attention"],
    "num_kv_shared_layers": 2,
    "hidden_size_per_layer_input": 8,
    "vocab_size_per_layer_input": 96,
}

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
        "n_group": 1,
        "topk_group": 1,
    },
    "minimax_m2": {
        "model_type": "minimax_m2",
        **_ATTN,
        "num_hidden_layers": 2,
        "intermediate_size": 16,
        "head_dim": 8,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
    },
    "ernie4_5": {"model_type": "ernie4_5", **_ATTN, "num_hidden_layers": 2, "intermediate_size": 48},
    "ernie4_5_moe": {
        "model_type": "ernie4_5_moe",
        **_ATTN,
        "num_hidden_layers": 3,
        "intermediate_size": 48,
        "moe_intermediate_size": 16,
        "moe_num_experts": 4,
        "moe_k": 2,
        "moe_num_shared_experts": 1,
        "moe_layer_start_index": 1,
    },
    "seed_oss": {"model_type": "seed_oss", **_ATTN, "num_hidden_layers": 2, "intermediate_size": 48, "head_dim": 16},
    "cohere2": {
        "model_type": "cohere2",
        **_ATTN,
        "num_hidden_layers": 4,
        "intermediate_size": 48,
        "sliding_window": 5,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
    },
    "exaone4": {
        "model_type": "exaone4",
        **_ATTN,
        "num_hidden_layers": 4,
        "intermediate_size": 48,
        "sliding_window": 5,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
    },
    "apertus": {"model_type": "apertus", **_ATTN, "num_hidden_layers": 2, "intermediate_size": 48},
    "ministral3": {"model_type": "ministral3", **_ATTN, "num_hidden_layers": 2, "intermediate_size": 48},
    "glm4_moe_lite": {
        "model_type": "glm4_moe_lite",
        **_ATTN,
        **_MOE,
        "num_key_value_heads": 4,
        "num_hidden_layers": 2,
        "intermediate_size": 48,
        "n_shared_experts": 1,
        "kv_lora_rank": 8,
        "q_lora_rank": 16,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
    },
    "ministral": {
        "model_type": "ministral",
        **_ATTN,
        "num_hidden_layers": 4,
        "intermediate_size": 48,
        "head_dim": 8,
        "sliding_window": 5,
        "layer_types": ["sliding_attention"] * 3 + ["full_attention"],
    },
    "hunyuan_v1_dense": {
        "model_type": "hunyuan_v1_dense",
        **_ATTN,
        "num_hidden_layers": 2,
        "intermediate_size": 48,
        "head_dim": 8,
    },
    "hunyuan_v1_moe": {
        "model_type": "hunyuan_v1_moe",
        **_ATTN,
        "num_hidden_layers": 2,
        "intermediate_size": 48,
        "head_dim": 8,
        "num_experts": 4,
        "moe_topk": 2,
    },
    "dots1": {
        "model_type": "dots1",
        **_ATTN,
        **_MOE,
        "num_hidden_layers": 3,
        "intermediate_size": 48,
        "n_shared_experts": 1,
        "first_k_dense_replace": 1,
        "n_group": 1,
        "topk_group": 1,
    },
    "lfm2_moe": {
        "model_type": "lfm2_moe",
        **_ATTN,
        "num_hidden_layers": 3,
        "intermediate_size": 48,
        "layer_types": ["conv", "full_attention", "conv"],
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
        "num_dense_layers": 1,
    },
    "granitemoehybrid": {
        "model_type": "granitemoehybrid",
        **_ATTN,
        "num_hidden_layers": 2,
        "intermediate_size": 48,
        "layer_types": ["mamba", "attention"],
        **_MAMBA,
        "num_local_experts": 4,
        "num_experts_per_tok": 2,
        "shared_intermediate_size": 24,
    },
    "falcon_h1": {
        "model_type": "falcon_h1",
        **_ATTN,
        "num_hidden_layers": 2,
        "intermediate_size": 48,
        "head_dim": 8,
        **_MAMBA,
        "mamba_d_ssm": 64,
    },
    "kimi_linear": {
        "model_type": "kimi_linear",
        **_ATTN,
        "num_key_value_heads": 4,
        "num_hidden_layers": 3,
        "intermediate_size": 48,
        "num_experts": 4,
        "num_experts_per_token": 2,
        "moe_intermediate_size": 16,
        "num_shared_experts": 1,
        "first_k_dense_replace": 1,
        "kv_lora_rank": 8,
        "qk_nope_head_dim": 8,
        "qk_rope_head_dim": 4,
        "v_head_dim": 8,
        "linear_num_heads": 2,
        "linear_head_dim": 8,
        "linear_attn_config": {"full_attn_layers": [3], "kda_layers": [1, 2]},
    },
    "glm_moe_dsa": {
        "model_type": "glm_moe_dsa",
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
    # Gemma 3n: AltUp over 3 streams, Laurel, per-layer inputs, per-layer MLP widths and activation
    # sparsity, the last two layers reusing the K/V of the last sliding and full layers before them.
    "gemma3n_text": {
        "model_type": "gemma3n_text",
        **_ATTN,
        **_GEMMA_LAYERS,
        "intermediate_size": [48, 48, 64, 64, 48, 48],
        "activation_sparsity_pattern": [0.95, 0.95, 0.0, 0.0, 0.0, 0.0],
        "altup_num_inputs": 3,
        "laurel_rank": 4,
    },
    # Gemma 4 (E2B-like): per-layer inputs, KV-shared layers with double-wide MLPs, wider full layers
    # whose values are their keys (attention_k_eq_v); 'vision' bidirectional attention, which text
    # alone leaves causal.
    "gemma4_text": {
        "model_type": "gemma4_text",
        **_ATTN,
        **_GEMMA_LAYERS,
        "use_bidirectional_attention": "vision",
        "intermediate_size": 48,
        "global_head_dim": 16,
        "num_global_key_value_heads": 1,
        "attention_k_eq_v": True,
        "use_double_wide_mlp": True,
    },
    # Gemma 4 (26B-A4B-like): every layer's dense MLP beside its routed experts, no per-layer inputs.
    "gemma4_text_moe": {
        "model_type": "gemma4_text",
        **_ATTN,
        **_GEMMA_LAYERS,
        "num_kv_shared_layers": 0,
        "hidden_size_per_layer_input": 0,
        "intermediate_size": 48,
        "global_head_dim": 16,
        "enable_moe_block": True,
        "num_experts": 4,
        "top_k_experts": 2,
        "moe_intermediate_size": 16,
    },
}

# Vision-language wrappers whose tower the structural count reads (packscope.agent.hf_towers): the
# decoders above (Qwen3.5's hybrids) or their Qwen3-VL siblings, a 3-block tower on 4-pixel patches
# merged 2 x 2, Qwen3-VL's deepstack mergers after blocks 0 and 1.
_GRID_TOWER = {
    "depth": 3,
    "hidden_size": 16,
    "intermediate_size": 24,
    "num_heads": 2,
    "patch_size": 4,
    "temporal_patch_size": 2,
    "spatial_merge_size": 2,
    "out_hidden_size": 32,
    "num_position_embeddings": 16,
}
_MROPE = {"rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 1, 1]}}
_QWEN3_VL_TEXT = {**_ATTN, "num_hidden_layers": 2, "intermediate_size": 48, "head_dim": 8, **_MROPE}
WRAPPERS: dict[str, dict[str, Any]] = {
    "qwen3_vl": {
        "model_type": "qwen3_vl",
        "text_config": {"model_type": "qwen3_vl_text", **_QWEN3_VL_TEXT},
        "vision_config": {"model_type": "qwen3_vl", **_GRID_TOWER, "deepstack_visual_indexes": [0, 1]},
    },
    "qwen3_vl_moe": {
        "model_type": "qwen3_vl_moe",
        "text_config": {
            "model_type": "qwen3_vl_moe_text",
            **_QWEN3_VL_TEXT,
            "num_experts": 4,
            "num_experts_per_tok": 2,
            "moe_intermediate_size": 16,
        },
        "vision_config": {"model_type": "qwen3_vl_moe", **_GRID_TOWER, "deepstack_visual_indexes": [1]},
    },
    "qwen3_5": {
        "model_type": "qwen3_5",
        "text_config": STRUCTURAL["qwen3_5_text"],
        "vision_config": {"model_type": "qwen3_5_vision", **_GRID_TOWER},
    },
    "qwen3_5_moe": {
        "model_type": "qwen3_5_moe",
        "text_config": STRUCTURAL["qwen3_5_moe_text"],
        "vision_config": {"model_type": "qwen3_5_moe_vision", **_GRID_TOWER},
    },
}
# InternVL: 16-pixel tiles of 4 x 4 patches and a class token, pixel-shuffled 2 x 2 to 4 tokens.
WRAPPERS["internvl"] = {
    "model_type": "internvl",
    "text_config": {"model_type": "qwen2", **_ATTN, "num_hidden_layers": 2, "intermediate_size": 48},
    "vision_config": {
        "model_type": "internvl_vision",
        "hidden_size": 16,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "image_size": 16,
        "patch_size": 4,
    },
    "downsample_ratio": 0.5,
}
# Qwen3-Omni's thinker (what a fine-tune runs): a Qwen3-VL-like tower with deepstack after blocks 0
# and 1, an MoE decoder, and the audio tower: 2 layers of width 16 over 16 mel bins, 4 conv channels,
# chunks of 100 frames (n_window 50, the width transformers' constant 13 tokens a chunk is for) and
# attention windows of 2 chunks (26 tokens).
OMNI_AUDIO = {
    "model_type": "qwen3_omni_moe_audio_encoder",
    "d_model": 16,
    "encoder_attention_heads": 2,
    "encoder_ffn_dim": 24,
    "encoder_layers": 2,
    "num_mel_bins": 16,
    "downsample_hidden_size": 4,
    "n_window": 50,
    "n_window_infer": 200,
    "output_dim": 32,
}
WRAPPERS["qwen3_omni_moe_thinker"] = {
    "model_type": "qwen3_omni_moe_thinker",
    "text_config": {
        "model_type": "qwen3_omni_moe_text",
        **_QWEN3_VL_TEXT,
        "num_experts": 4,
        "num_experts_per_tok": 2,
        "moe_intermediate_size": 16,
    },
    "vision_config": {"model_type": "qwen3_omni_moe_vision_encoder", **_GRID_TOWER, "deepstack_visual_indexes": [0, 1]},
    "audio_config": OMNI_AUDIO,
}
# Gemma 4's audio tower: 2 layers of width 16, convolutions of 8 and 4 channels (8 mel bins, as
# input_proj_linear reads 8 // 4 x 4 values: transformers ties the mel width to the first's channels),
# output dims 24, the published attention (blocks of 12 over 24 slots).
GEMMA4_AUDIO = {
    "model_type": "gemma4_audio",
    "hidden_size": 16,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "subsampling_conv_channels": [8, 4],
    "output_proj_dims": 24,
}
# Gemma 4 with its vision tower: 2 layers of width 16 on 4-pixel patches (48 values each), pooled
# 2 x 2, and the E2B-like decoder above.
WRAPPERS["gemma4"] = {
    "model_type": "gemma4",
    "text_config": {**STRUCTURAL["gemma4_text"], "pad_token_id": 0},  # the wrapper pads its image slots with it
    "vision_config": {
        "model_type": "gemma4_vision",
        "hidden_size": 16,
        "intermediate_size": 24,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "num_key_value_heads": 2,
        "head_dim": 8,
        "patch_size": 4,
        "pooling_kernel_size": 2,
        "position_embedding_size": 64,
    },
}
