"""agent/vision.py: a micro-batch's vision sums on the device, against the pure-Python reference
(packscope.core.vision) on random grids, and without a host sync."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from packscope.agent.vision import batch_vision_sums, fixed_sums, grid_thw_sums, image_sizes_sums, rows_sums
from packscope.core.hf_config import read_hf_config
from packscope.core.vision import (
    VISION_SUMS,
    VisionSpec,
    batch_sums,
    fixed_image_sums,
    padded_rows_sums,
    pixels_to_grid,
)
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


# Gemma 4's tower as the structural count reads it (defaults: 768 wide, 16 px patches pooled 3 x 3).
GEMMA4 = VisionSpec(
    tower="gemma4", layers=16, hidden=768, heads=12, ffn=3072, gated=True, patch_size=16, patch_inputs=768,
    spatial_merge=3, projector=((768, 2304),),
)  # fmt: skip


def position_table(grids: list[tuple[int, int]], slots: int) -> torch.Tensor:
    """Gemma 4's image_position_ids: each image's (x, y) patch positions, then (-1, -1) padding."""
    table = torch.full((len(grids), slots, 2), -1, dtype=torch.int64)
    for i, (h, w) in enumerate(grids):
        ys, xs = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        table[i, : h * w] = torch.stack([xs.reshape(-1), ys.reshape(-1)], dim=1)
    return table


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


@settings(max_examples=100, deadline=None)
@given(grids=st.lists(st.tuples(*[st.integers(1, 8).map(lambda k: 3 * k)] * 2), max_size=5), extra=st.integers(0, 6))
def test_padded_rows_sums_are_the_reference(grids, extra):
    slots = max([h * w for h, w in grids], default=9) + 9 * extra
    table = position_table(grids, slots)
    assert values(rows_sums(GEMMA4, table)) == padded_rows_sums(GEMMA4, grids, slots)
    batch = {"image_position_ids": table, "video_position_ids": table}
    assert values(batch_vision_sums(GEMMA4, batch)) == padded_rows_sums(GEMMA4, grids + grids, slots)
    host = batch_vision_sums(GEMMA4, {"image_position_ids": table.tolist()})  # a host list
    assert values(host) == padded_rows_sums(GEMMA4, grids, slots)


def test_padded_rows_refuse_bad_shapes_and_slots():
    with pytest.raises(ValueError, match=r"image_position_ids must be \[images, slots, 2\]"):
        rows_sums(GEMMA4, torch.zeros(2, 9, dtype=torch.int64))
    with pytest.raises(ValueError, match="slots must hold it and pool"):
        padded_rows_sums(GEMMA4, [(3, 6)], 12)  # 18 patches in 12 slots
    with pytest.raises(ValueError, match="slots must hold it and pool"):
        padded_rows_sums(GEMMA4, [(3, 3)], 10)  # 10 slots do not pool 3 x 3
    with pytest.raises(ValueError, match="not padded rows"):
        padded_rows_sums(QWEN, [(2, 2)], 4)


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
    rows = rows_sums(GEMMA4, position_table([(3, 6), (6, 6)], 45))
    from_batch = batch_vision_sums(QWEN, {"image_grid_thw": table, "video_grid_thw": table})
    pixtral = image_sizes_sums(MISTRAL3, sizes)
    with pytest.raises(AssertionError, match="read on the host"):
        bool(table.sum())  # the guard is live
    monkeypatch.undo()
    assert all(v.dim() == 0 and v.dtype == torch.int64 for v in on_device.values())
    assert values(on_device) == batch_sums(QWEN, grids)
    assert values(rows) == padded_rows_sums(GEMMA4, [(3, 6), (6, 6)], 45)
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


@pytest.mark.gpu
def test_padded_rows_no_sync_on_cuda():
    table = position_table([(42, 57), (48, 48)], 2520).to("cuda")
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        sums = batch_vision_sums(GEMMA4, {"image_position_ids": table})
    finally:
        torch.cuda.set_sync_debug_mode("default")
    assert values(sums) == padded_rows_sums(GEMMA4, [(42, 57), (48, 48)], 2520)
