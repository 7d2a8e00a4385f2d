"""VisionSpec on its own: the strict dict, ModelSpec.vision's (de)serialisation, the reference sums'
rules, and the formula's arithmetic written out by hand for one small tower."""

from __future__ import annotations

import json

import pytest

from packscope.core.flops import ModelSpec
from packscope.core.vision import (
    VISION_SUMS,
    VisionSpec,
    batch_sums,
    fixed_image_sums,
    frame_window_sq,
    grid_sums,
    pixels_to_grid,
    vision_flops,
)

WINDOWED = VisionSpec(
    tower="qwen2_5_vl", layers=3, hidden=16, heads=2, ffn=24, gated=True, patch_size=4, patch_inputs=96,
    spatial_merge=2, projector=((64, 64), (64, 32)), window=2, windowed_layers=(1, 0, 1),
)  # fmt: skip
CLASS_TOKEN = VisionSpec(
    tower="clip", layers=2, hidden=16, heads=2, ffn=32, gated=False, patch_size=4, patch_inputs=48,
    projector=((16, 32), (32, 32)), class_tokens=1, projected_class_tokens=1, image_grid=(4, 4),
)  # fmt: skip
DECODER = dict(layers=2, hidden=64, heads=4, ffn=128, vocab=1000)


def test_the_coefficients_by_hand():
    # Per patch: patch embedding 96·16, 3 blocks of 4·16² + 3·16·24, the merger's (64·64 + 64·32) over 4 patches.
    assert WINDOWED.c_lin_by_component == {
        "patch_embedding": 6 * 96 * 16,
        "attention": 6 * 3 * 4 * 16 * 16,
        "mlp": 6 * 3 * 3 * 16 * 24,
        "projector": 6 * (64 * 64 + 64 * 32) // 4,
    }
    assert WINDOWED.c_core_by_kind == {"full": 12 * 16 * 1, "window": 12 * 16 * 2}
    assert WINDOWED.c_image == 0
    # The class token: through both blocks (4·16² + 2·16·32) and, kept, through the projector.
    assert CLASS_TOKEN.c_image == 6 * (2 * (4 * 256 + 2 * 16 * 32) + (16 * 32 + 32 * 32))


def test_the_sums_of_one_grid_by_hand():
    # 6 x 10 patches, 2 x 2 merge: a 3 x 5 merged grid in windows of 2 -> rows 2, 1 and columns 2, 2, 1.
    assert frame_window_sq(WINDOWED, 6, 10) == 2**4 * (2 * 2 + 1 * 1) * (2 * 2 + 2 * 2 + 1 * 1)
    assert grid_sums(WINDOWED, (3, 6, 10)) == {
        "vision_images": 3,
        "vision_patches": 180,
        "vision_sq_sum": 3 * 60**2,
        "vision_window_sq_sum": 3 * 16 * 5 * 9,
        "cross_text_tokens": 0,  # no cross-attention layers read this tower
        "cross_pairs": 0,
    }
    # A class token joins every image's attention sequence.
    assert grid_sums(CLASS_TOKEN, (1, 4, 4))["vision_sq_sum"] == 17**2


def test_flops_is_every_sum_times_its_coefficient():
    sums = batch_sums(WINDOWED, [(1, 4, 4), (2, 6, 10)])
    expected = (
        sums["vision_patches"] * WINDOWED.c_lin
        + sums["vision_sq_sum"] * 12 * 16
        + sums["vision_window_sq_sum"] * 12 * 16 * 2
    )
    assert WINDOWED.flops(sums) == expected == sum(WINDOWED.flops_by_component(sums).values())
    assert sum(WINDOWED.flops_split(sums).values()) == expected
    assert "vision_images" not in WINDOWED.c_by_sum  # no class token: the image count is not read
    assert vision_flops({k: v for k, v in sums.items() if k != "vision_images"}, WINDOWED.c_by_sum) == expected


def test_the_reference_refuses_what_the_tower_cannot_take():
    with pytest.raises(ValueError, match="does not divide into the tower's 2 x 2 merge blocks"):
        grid_sums(WINDOWED, (1, 5, 4))
    with pytest.raises(ValueError, match=r"every image of a clip tower is 1 x 4 x 4 patches"):
        grid_sums(CLASS_TOKEN, (1, 4, 8))
    with pytest.raises(ValueError, match="an image grid's t is an integer >= 1"):
        grid_sums(WINDOWED, (0, 4, 4))
    with pytest.raises(ValueError, match="an image count is an integer >= 0"):
        fixed_image_sums(CLASS_TOKEN, True)  # type: ignore[arg-type]
    assert fixed_image_sums(CLASS_TOKEN, 0) == dict.fromkeys(VISION_SUMS, 0)
    assert pixels_to_grid(WINDOWED, 17, 30) == (1, 4, 7)  # a partial patch is dropped


@pytest.mark.parametrize(
    "change,message",
    [
        ({"tower": "dinov2"}, "vision field 'tower' must be one of"),
        ({"layers": True}, "'vision.layers' must be an integer"),
        ({"heads": 3}, "not divisible by vision.heads"),
        ({"windowed_layers": (1, 0)}, "windowed_layers has 2 entries for 3 layers"),
        ({"window": None}, "vision.window and vision.windowed_layers go together"),
        ({"image_grid": (8, 8)}, "a qwen2_5_vl tower takes no vision.image_grid"),
        ({"projector": ((64, 64, 1),)}, r"vision.projector\[0\] must be an \[in, out\] pair"),
        ({"projector": ((3, 1),)}, "not a whole number of FLOPs per patch"),
        ({"projected_class_tokens": 1}, "cannot exceed vision.class_tokens"),
    ],
)
def test_bad_fields_are_refused_by_name(change, message):
    fields = {**WINDOWED.to_dict(), **change}
    with pytest.raises(ValueError, match=message):
        VisionSpec.from_dict(fields)


def test_the_dict_is_strict():
    data = WINDOWED.to_dict()
    assert VisionSpec.from_dict(json.loads(json.dumps(data))) == WINDOWED
    with pytest.raises(ValueError, match="unknown model vision field"):
        VisionSpec.from_dict({**data, "merge": 4})
    with pytest.raises(ValueError, match="lacks the field"):
        VisionSpec.from_dict({k: v for k, v in data.items() if k != "patch_inputs"})
    with pytest.raises(ValueError, match="must be null or a list"):
        VisionSpec.from_dict({**data, "windowed_layers": "101"})


def test_model_spec_carries_the_tower_only_when_set():
    text_only = ModelSpec(**DECODER)
    assert "vision" not in text_only.to_dict()  # the dict every older agent sent
    with_tower = ModelSpec(**DECODER, vision=CLASS_TOKEN)
    data = json.loads(json.dumps(with_tower.to_dict()))
    assert data["vision"] == CLASS_TOKEN.to_dict()
    assert ModelSpec.from_dict(data) == with_tower
    assert with_tower != text_only and with_tower.c_lin == text_only.c_lin  # the decoder's count is unchanged
    with pytest.raises(ValueError, match="unknown model vision field"):
        ModelSpec.from_dict({**data, "vision": {**data["vision"], "extra": 1}})
    with pytest.raises(ValueError, match="model vision is a JSON object"):
        ModelSpec.from_dict({**data, "vision": [1]})
    with pytest.raises(ValueError, match="must be a VisionSpec"):
        ModelSpec(**DECODER, vision=data["vision"])  # type: ignore[arg-type]
