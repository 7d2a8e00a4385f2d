"""agent/vision.py: a micro-batch's vision sums on the device, against the pure-Python reference
(packscope.core.vision) on random grids, and without a host sync."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from packscope.agent.vision import batch_vision_sums, fixed_sums, grid_thw_sums, image_sizes_sums
from packscope.core.hf_config import read_hf_config
from packscope.core.vision import VISION_SUMS, VisionSpec, batch_sums, fixed_image_sums, pixels_to_grid
from tests.core.published_vision import PUBLISHED_VISION

QWEN = read_hf_config(PUBLISHED_VISION["qwen2_5_vl_7b.json"]).vision  # window 4 merged tokens, 2 x 2 merge
MISTRAL3 = read_hf_config(PUBLISHED_VISION["vision/mistral_small_3_1_24b.json"]).vision  # Pixtral, 14 px patches
GEMMA3 = read_hf_config(PUBLISHED_VISION["gemma3_12b.json"]).vision  # 64 x 64 patches per image
LLAMA4 = read_hf_config(PUBLISHED_VISION["llama4_scout_17b_16e.json"]).vision  # 24 x 24 patches + a class token
# A window of 3 merged tokens and a 3 x 3 merge: grids that differ from the published ones.
ODD = VisionSpec(
    tower="qwen2_5_vl", layers=4, hidden=32, heads=4, ffn=48, gated=True, patch_size=4, patch_inputs=96,
    spatial_merge=3, projector=((288, 288), (288, 64)), window=3, windowed_layers=(1, 0, 1, 1),
)  # fmt: skip


def values(sums: dict) -> dict[str, int]:
    return {name: int(v) for name, v in sums.items()}


def grids_of(merge: int) -> st.SearchStrategy[list[tuple[int, int, int]]]:
    side = st.integers(1, 24).map(lambda k: k * merge)
    return st.lists(st.tuples(st.integers(1, 4), side, side), min_size=0, max_size=8)


@settings(max_examples=150, deadline=None)
@given(grids=grids_of(2))
def test_grid_thw_sums_are_the_reference(grids):
    table = torch.tensor(grids, dtype=torch.int64).reshape(-1, 3)
    assert values(grid_thw_sums(QWEN, table)) == batch_sums(QWEN, grids)


@settings(max_examples=100, deadline=None)
@given(grids=grids_of(3), dtype=st.sampled_from([torch.int32, torch.int64]))
def test_grid_thw_sums_for_another_window_and_merge(grids, dtype):
    table = torch.tensor(grids, dtype=dtype).reshape(-1, 3)
    assert values(grid_thw_sums(ODD, table)) == batch_sums(ODD, grids)


@settings(max_examples=100, deadline=None)
@given(sizes=st.lists(st.tuples(st.integers(1, 40), st.integers(1, 40)), min_size=1, max_size=6))
def test_image_sizes_sums_are_the_reference(sizes):
    step = MISTRAL3.patch_size * MISTRAL3.spatial_merge  # the processor's resize granularity
    pixels = [(h * step, w * step) for h, w in sizes]
    expected = batch_sums(MISTRAL3, [pixels_to_grid(MISTRAL3, h, w) for h, w in pixels])
    assert values(image_sizes_sums(MISTRAL3, torch.tensor(pixels))) == expected
    assert values(batch_vision_sums(MISTRAL3, {"image_sizes": pixels})) == expected  # a host list


@pytest.mark.parametrize("vision", [GEMMA3, LLAMA4], ids=["gemma3", "llama4"])
def test_a_fixed_size_tower_counts_from_the_shape(vision):
    side = vision.image_grid[0] * vision.patch_size
    pixels = torch.empty(5, 3, side, side, device="meta")  # no values: none is read
    assert (
        fixed_sums(vision, pixels) == fixed_image_sums(vision, 5) == batch_sums(vision, [(1, *vision.image_grid)] * 5)
    )
    assert batch_vision_sums(vision, {"pixel_values": pixels}) == fixed_image_sums(vision, 5)
    with pytest.raises(ValueError, match=rf"pixel_values \[images, channels, {side}, {side}\]"):
        fixed_sums(vision, torch.empty(5, 3, side, side + vision.patch_size, device="meta"))


def test_images_and_videos_of_one_batch_add_up():
    images, videos = [(1, 28, 40), (1, 14, 14)], [(6, 16, 22)]
    batch = {"image_grid_thw": torch.tensor(images), "video_grid_thw": torch.tensor(videos)}
    assert values(batch_vision_sums(QWEN, batch)) == batch_sums(QWEN, images + videos)


def test_a_batch_without_images_gives_zeros():
    assert values(batch_vision_sums(QWEN, {"input_ids": torch.zeros(2, 8)})) == dict.fromkeys(VISION_SUMS, 0)
    empty = grid_thw_sums(QWEN, torch.zeros(0, 3, dtype=torch.int64))
    assert values(empty) == dict.fromkeys(VISION_SUMS, 0)


def test_bad_tables_are_refused_from_their_shape():
    with pytest.raises(ValueError, match=r"image_grid_thw must be \[images, 3\]"):
        grid_thw_sums(QWEN, torch.zeros(3, dtype=torch.int64))
    with pytest.raises(ValueError, match="must hold integers"):
        grid_thw_sums(QWEN, torch.zeros(2, 3))
    with pytest.raises(ValueError, match=r"image_sizes must be \[images, 2\]"):
        image_sizes_sums(MISTRAL3, torch.zeros(2, 3, dtype=torch.int64))


def test_no_value_is_read_back(monkeypatch):
    """Every way of reading a tensor's value on the host raises while the device functions run,
    so none of them is used; the results are then read and checked."""
    grids = [(1, 36, 52), (2, 20, 28)]
    table, sizes = torch.tensor(grids), torch.tensor([[448, 644], [224, 280]])

    def refuse(self, *args, **kwargs):
        raise AssertionError("a tensor's value was read on the host")

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero"):
        monkeypatch.setattr(torch.Tensor, name, refuse)
    on_device = grid_thw_sums(QWEN, table)
    from_batch = batch_vision_sums(QWEN, {"image_grid_thw": table, "video_grid_thw": table})
    pixtral = image_sizes_sums(MISTRAL3, sizes)
    with pytest.raises(AssertionError, match="read on the host"):
        bool(table.sum())  # the guard is live
    monkeypatch.undo()
    assert all(v.dim() == 0 and v.dtype == torch.int64 for v in on_device.values())
    assert values(on_device) == batch_sums(QWEN, grids)
    assert values(from_batch) == batch_sums(QWEN, grids + grids)
    assert values(pixtral) == batch_sums(MISTRAL3, [pixels_to_grid(MISTRAL3, h, w) for h, w in sizes.tolist()])


@pytest.mark.gpu
def test_no_sync_on_cuda():
    table = torch.tensor([(1, 36, 52), (2, 20, 28)], device="cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sums = batch_vision_sums(QWEN, {"image_grid_thw": table})
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert values(sums) == batch_sums(QWEN, [(1, 36, 52), (2, 20, 28)])
