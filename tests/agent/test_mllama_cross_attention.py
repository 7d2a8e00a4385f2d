"""Why mllama stays refused (agent/hf_structure.py REFUSED_KINDS, docs/flops.md): what transformers'
own mllama does in its cross-attention layers, on a tiny random model on the CPU. In a micro-batch
with images each row's text positions attend densely to all its images' tile tokens (images x tiles
x (patches + 1)), the mask applied to the scores; in a micro-batch without images the layers are
skipped outright. Neither work is a function of the record's sums."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from transformers import AutoConfig, AutoModelForImageTextToText  # noqa: E402
from transformers.modeling_utils import AttentionInterface  # noqa: E402

from tests.core.vision_meta import attend  # noqa: E402

COUNT = "packscope_mllama_count"
CALLS: list[tuple[str, int, int, int]] = []  # (attention class, rows, query length, key length)


def counting_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    CALLS.append((type(module).__name__, query.shape[0], query.shape[-2], key.shape[-2]))
    groups = query.shape[1] // key.shape[1]
    key, value = key.repeat_interleave(groups, 1), value.repeat_interleave(groups, 1)
    return attend(query, key, value, attention_mask, scaling), None


AttentionInterface.register(COUNT, counting_attention)


def test_mllama_cross_attention_is_text_by_image_tokens_and_runs_only_with_images():
    text = {"hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2, "num_hidden_layers": 3}
    text |= {"intermediate_size": 48, "vocab_size": 300, "pad_token_id": 0, "cross_attention_layers": [1]}
    vision = {"hidden_size": 16, "attention_heads": 2, "num_hidden_layers": 2, "num_global_layers": 1}
    vision |= {"intermediate_size": 24, "image_size": 16, "patch_size": 4, "intermediate_layers_indices": [0]}
    vision |= {"vision_output_dim": 32}
    config = AutoConfig.for_model("mllama", text_config=text, vision_config=vision)
    for part in (config, config.text_config, config.vision_config):
        part._attn_implementation = COUNT
    torch.manual_seed(0)
    model = AutoModelForImageTextToText.from_config(config)
    rows, length, images, tiles = 2, 7, 2, config.vision_config.max_num_tiles
    patches = (16 // 4) ** 2
    ids = torch.randint(1, 290, (rows, length))
    CALLS.clear()
    model(
        input_ids=ids,
        pixel_values=torch.randn(rows, images, tiles, 3, 16, 16),
        aspect_ratio_ids=torch.ones(rows, images, dtype=torch.long),
        aspect_ratio_mask=torch.ones(rows, images, tiles, dtype=torch.long),
        cross_attention_mask=torch.ones(rows, length, images, tiles, dtype=torch.long),
    )
    cross = [c for c in CALLS if c[0] == "MllamaTextCrossAttention"]
    assert cross == [("MllamaTextCrossAttention", rows, length, images * tiles * (patches + 1))]
    CALLS.clear()
    model(input_ids=ids)
    assert [c[0] for c in CALLS] == ["MllamaTextSelfAttention"] * 2  # the cross-attention layer skipped
