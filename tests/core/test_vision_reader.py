"""Reading a multimodal config's tower (packscope.core.hf_vision): the towers refused by name, the
fields checked, what a tower runs unused, and `packscope flops` with images."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path
from typing import Any

import pytest

from packscope.commands.cli import main
from packscope.core.hf_config import HFConfigError, read_hf_config, spec_from_hf_dict
from packscope.core.vision import batch_sums, fixed_image_sums
from tests.core.published_vision import PUBLISHED_VISION

DELETE = object()


def published(name: str) -> dict[str, Any]:
    return json.loads(PUBLISHED_VISION[name].read_text())


def changed(name: str, path: str, value: Any) -> dict[str, Any]:
    cfg = copy.deepcopy(published(name))
    where = cfg
    *parents, key = path.split(".")
    for part in parents:
        where = where[part]
    if value is DELETE:
        where.pop(key)
    else:
        where[key] = value
    return cfg


QWEN, GEMMA, LLAMA4 = "qwen2_5_vl_7b.json", "gemma3_12b.json", "llama4_scout_17b_16e.json"
MISTRAL3, LLAVA = "vision/mistral_small_3_1_24b.json", "vision/llava_1_5_7b.json"

BAD = [
    (LLAVA, "vision_config.model_type", "dinov2", "'vision_config.model_type' 'dinov2' is a vision tower packscope"),
    (GEMMA, "vision_config.model_type", "clip_vision_model", "it counts siglip_vision_model here"),
    (QWEN, "model_type", "qwen2_vl", "model_type 'qwen2_vl' is not supported: its vision tower (vision_config)"),
    (LLAVA, "model_type", "llava_next", "model_type 'llava_next' is not supported: its vision tower"),
    (GEMMA, "vision_config", DELETE, "'vision_config' is missing; transformers would build its default tower"),
    (MISTRAL3, "vision_feature_layer", [-1, -2], "'vision_feature_layer' must be an integer, got [-1, -2]"),
    (LLAVA, "vision_feature_layer", 0, "must pick block outputs 1..24 of the tower"),
    (LLAVA, "vision_feature_layer", -26, "must pick block outputs 1..24"),
    (LLAVA, "vision_feature_select_strategy", "cls", "must be 'default' or 'full'"),
    (GEMMA, "mm_tokens_per_image", 200, "'mm_tokens_per_image' (200) must be a square"),
    (GEMMA, "mm_tokens_per_image", 9, "must be a square whose side divides the 64 patches per side"),
    (LLAMA4, "vision_config.pixel_shuffle_ratio", 0.3, "'vision_config.pixel_shuffle_ratio' (0.3) must be 1/k"),
    (LLAMA4, "vision_config.pixel_shuffle_ratio", "0.5", "must be a number in"),
    (QWEN, "vision_config.window_size", 20, "'vision_config.window_size' (20) is below one merged token"),
    (QWEN, "vision_config.num_heads", 7, "'vision_config.num_heads' (7) must divide hidden_size (1280)"),
    (QWEN, "vision_config.depth", True, "'vision_config.depth' must be an integer, got True"),
    (QWEN, "vision_config.fullatt_block_indexes", "7", "must be a list of block indexes"),
    (QWEN, "vision_config.deepstack_visual_indexes", [8], "'vision_config.deepstack_visual_indexes' is set"),
    (MISTRAL3, "vision_config.head_dim", 128, "'vision_config.head_dim' (128) must be hidden_size / num_attention"),
]


@pytest.mark.parametrize("name,path,value,message", BAD, ids=lambda x: x if isinstance(x, str) else None)
def test_a_tower_we_cannot_count_exactly_is_refused_by_name(tmp_path, capsys, name, path, value, message):
    cfg = changed(name, path, value)
    with pytest.raises(HFConfigError, match=re.escape(message)):
        spec_from_hf_dict(cfg)
    config = tmp_path / "config.json"
    config.write_text(json.dumps(cfg))
    assert main(["flops", "--hf-config", str(config), "--pack", "100"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("packscope flops: error: ") and err.count("\n") == 1, err


def test_llava_with_siglip_needs_the_full_strategy():
    siglip = changed(LLAVA, "vision_config", {**published(LLAVA)["vision_config"], "model_type": "siglip_vision_model"})
    with pytest.raises(HFConfigError, match="has no class token: it would drop an image patch"):
        spec_from_hf_dict(siglip)
    siglip["vision_feature_select_strategy"] = "full"
    vision = spec_from_hf_dict(siglip).vision
    assert vision is not None and (vision.tower, vision.class_tokens) == ("siglip", 0)


def test_the_feature_layer_decides_the_counted_blocks():
    # The deepest of several concatenated layers decides; linear_1 reads their concatenation.
    both = spec_from_hf_dict(changed(LLAVA, "vision_feature_layer", [-5, -2]))
    assert both.vision is not None and both.vision.layers == 23 and both.vision.projector[0] == (2048, 4096)
    assert spec_from_hf_dict(changed(LLAVA, "vision_feature_layer", 12)).vision.layers == 12  # type: ignore[union-attr]
    last = spec_from_hf_dict(changed(LLAVA, "vision_feature_layer", -1))
    assert last.vision is not None and last.vision.layers == 24 and last.not_counted == ()
    assert read_hf_config(PUBLISHED_VISION[LLAVA]).not_counted == (
        "the CLIP tower's last 1 encoder layer(s) (vision_feature_layer): "
        "run forward, their output unused, no backward",
    )


def test_qwen_with_every_block_full_has_no_window():
    cfg = changed(QWEN, "vision_config.fullatt_block_indexes", list(range(32)))
    vision = spec_from_hf_dict(cfg).vision
    assert vision is not None and vision.window is None and set(vision.c_core_by_kind) == {"full"}
    assert batch_sums(vision, [(1, 36, 52)])["vision_window_sq_sum"] == 0


def test_an_old_checkpoints_vision_model_type_is_read():
    """Some Qwen2.5-VL checkpoints carry the wrapper's model_type in vision_config; transformers
    reads them as Qwen2_5_VLVisionConfig."""
    old = changed(QWEN, "vision_config.model_type", "qwen2_5_vl")
    assert spec_from_hf_dict(old) == read_hf_config(PUBLISHED_VISION[QWEN])


# -- `packscope flops` with images ---------------------------------------------------------------


def run(capsys, name: str, *args: str) -> tuple[int, dict[str, Any], str]:
    rc = main(["flops", "--hf-config", str(PUBLISHED_VISION[name]), *args])
    out = capsys.readouterr()
    return rc, (json.loads(out.out) if rc == 0 else {}), out.err


def test_the_cli_adds_the_tower_to_every_view(capsys):
    rc, plain, _ = run(capsys, QWEN, "--pack", "3000,1000", "--pack-length", "4096")
    assert rc == 0 and "vision" not in plain["flops_split"]["thd"]
    rc, out, _ = run(
        capsys, QWEN, "--pack", "3000,1000", "--pack-length", "4096", "--image", "1,36,52", "--image-pixels", "280,392"
    )
    vision = read_hf_config(PUBLISHED_VISION[QWEN]).vision
    assert rc == 0 and vision is not None
    sums = batch_sums(vision, [(1, 36, 52), (1, 20, 28)])  # 280 x 392 px in 14 px patches
    assert out["vision"]["sums"] == sums and out["vision"]["decoder_tokens"] == (36 * 52 + 20 * 28) // 4
    assert out["vision"]["flops"] == vision.flops(sums) == sum(out["vision"]["flops_by_component"].values())
    for view in ("bshd", "thd", "useful"):
        assert out[f"flops_{view}"] == plain[f"flops_{view}"] + vision.flops(sums)
        assert sum(out["flops_split"][view].values()) == out[f"flops_{view}"]


def test_the_cli_counts_fixed_size_images(capsys):
    rc, out, _ = run(capsys, GEMMA, "--pack", "2000", "--images", "3")
    vision = read_hf_config(PUBLISHED_VISION[GEMMA]).vision
    assert rc == 0 and vision is not None
    assert out["vision"]["sums"] == fixed_image_sums(vision, 3) and out["vision"]["decoder_tokens"] == 3 * 256


@pytest.mark.parametrize(
    "name,args,message",
    [
        ("qwen2_5_7b.json", ["--images", "1"], "the model has no vision tower"),
        (GEMMA, ["--image", "1,32,32"], "every image of a siglip tower is 1 x 64 x 64 patches"),
        (QWEN, ["--images", "2"], "a qwen2_5_vl tower's images differ in size: give their grids"),
        (QWEN, ["--image", "1,35,52"], "does not divide into the tower's 2 x 2 merge blocks"),
    ],
)
def test_the_cli_refuses_images_the_tower_cannot_take(capsys, name, args, message):
    path = PUBLISHED_VISION.get(name, Path(PUBLISHED_VISION[QWEN]).parent / name)
    rc = main(["flops", "--hf-config", str(path), "--pack", "100", *args])
    assert rc == 2 and message in capsys.readouterr().err
