"""Tiny random vision-language configs, one per supported tower (and Llava's variants), small
enough to run images through on the CPU, with their image batches.

Patches are 4 pixels wide so that images of a few dozen patches stay cheap; Qwen2.5-VL's window
is 2 x 2 merged tokens (window_size = 2 · spatial_merge_size · patch_size = 16 pixels) so that
images of 3 to 5 merged tokens a side hold full and partial windows; its second block is full.
"""

from __future__ import annotations

from typing import Any

from tests.core.tiny_configs import TINY

_TOWER = {"hidden_size": 16, "intermediate_size": 32, "num_attention_heads": 2, "patch_size": 4}

TINY_VLM: dict[str, dict[str, Any]] = {
    "qwen2_5_vl": {
        **{k: v for k, v in TINY["qwen2"].items() if k != "model_type"},
        "model_type": "qwen2_5_vl",
        "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]},
        "vision_config": {
            "depth": 3,
            "hidden_size": 16,
            "intermediate_size": 24,
            "num_heads": 2,
            "patch_size": 4,
            "temporal_patch_size": 2,
            "spatial_merge_size": 2,
            "window_size": 16,
            "fullatt_block_indexes": [1],
            "out_hidden_size": 32,
        },
    },
    "gemma3": {
        "model_type": "gemma3",
        "text_config": TINY["gemma3_text"],
        "vision_config": {
            "model_type": "siglip_vision_model",
            **_TOWER,
            "num_hidden_layers": 2,
            "image_size": 32,  # 8 x 8 patches, pooled 2 x 2 to 16 tokens
            "vision_use_head": False,
        },
        "mm_tokens_per_image": 16,
    },
    "llama4": {
        "model_type": "llama4",
        "text_config": TINY["llama4_text"],
        "vision_config": {
            "model_type": "llama4_vision_model",
            **_TOWER,
            "intermediate_size": 64,  # 4 x hidden: what the 2 x 2 pixel shuffle hands the adapter's fc1
            "num_hidden_layers": 2,
            "image_size": 16,  # 4 x 4 patches and a class token per tile
            "pixel_shuffle_ratio": 0.5,
            "projector_input_dim": 24,
            "projector_output_dim": 24,
            "vision_output_dim": 24,
        },
    },
    "mistral3": {
        "model_type": "mistral3",
        "text_config": TINY["mistral"],
        "vision_config": {"model_type": "pixtral", **_TOWER, "num_hidden_layers": 2, "image_size": 64},
        "spatial_merge_size": 2,
    },
    "llava": {  # CLIP, the class token dropped, the features of the last-but-one layer (the defaults)
        "model_type": "llava",
        "text_config": TINY["llama"],
        "vision_config": {"model_type": "clip_vision_model", **_TOWER, "num_hidden_layers": 3, "image_size": 16},
    },
}
TINY_VLM["llava_full_two_layers"] = {  # the class token kept, two feature layers concatenated
    **TINY_VLM["llava"],
    "vision_feature_select_strategy": "full",
    "vision_feature_layer": [-3, -1],
}
TINY_VLM["llava_siglip"] = {
    **TINY_VLM["llava"],
    "vision_config": {"model_type": "siglip_vision_model", **_TOWER, "num_hidden_layers": 2, "image_size": 16},
    "vision_feature_select_strategy": "full",
    "vision_feature_layer": -1,
}
TINY_VLM["llava_pixtral"] = {
    **TINY_VLM["llava"],
    "vision_config": {"model_type": "pixtral", **_TOWER, "num_hidden_layers": 2, "image_size": 64},
    "vision_feature_select_strategy": "full",
    "vision_feature_layer": -1,
}

# Image batches: (t, h, w) in patches. Qwen2.5-VL's are multiples of its 2 x 2 merge (merged grids
# of 2 to 5 tokens a side: full and partial windows, a video of 3 frames); Pixtral's of its merge
# too (Mistral 3's processor resizes to multiples of patch_size x spatial_merge_size); the fixed-
# size towers take every image at their one size.
GRIDS: dict[str, list[list[tuple[int, int, int]]]] = {
    "qwen2_5_vl": [[(1, 4, 4)], [(1, 6, 10), (1, 8, 4)], [(3, 4, 6), (1, 10, 6)]],
    "pixtral": [[(1, 4, 6)], [(1, 4, 6), (1, 2, 8), (1, 6, 6)]],
}
FIXED_COUNTS = [1, 3]
