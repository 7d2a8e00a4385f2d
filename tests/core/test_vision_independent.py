"""The independent check of the vision term: packscope's reading of a config against what
transformers' own towers compute on images (tests/core/vision_meta.py), never our formula.

* Tiny random towers (tests/core/tiny_vision_configs.py), on the CPU, forward and backward: the
  GEMM FLOPs per component that received a gradient, the (query, key) pairs every block's
  attention calls computed, and the work that ran forward only (Llava's layer after its feature
  layer), on image batches of several sizes.
* Qwen2.5-VL's own ``get_vision_window_index`` and ``get_vision_cu_seqlens`` on many grids: the
  window and full-attention sums are the Σ len² of the windows and frames they cut.
* The published configs at their real size on the meta device (forward and backward, shapes
  only): every component within 0.1 % (in fact exact).
"""

from __future__ import annotations

import functools
import json
from typing import Any

import pytest

pytest.importorskip("transformers")

import torch
from transformers.vision_utils import (
    get_vision_cu_seqlens,
    get_vision_position_ids,
    get_vision_window_index,
)

from packscope.core.hf_config import read_hf_config, spec_from_hf_config, spec_from_hf_dict
from packscope.core.vision import VISION_COMPONENTS, VisionSpec, batch_sums
from tests.core import hf_meta as hf
from tests.core import vision_meta as vm
from tests.core.published_vision import PUBLISHED_VISION
from tests.core.test_published_configs import loadable
from tests.core.tiny_vision_configs import FIXED_COUNTS, GRIDS, TINY_VLM

COMPONENTS = (*VISION_COMPONENTS, "core_full", "core_window")


def tiny_batches(vision: VisionSpec) -> list[list[tuple[int, int, int]]]:
    if vision.image_grid is not None:
        return [[(1, *vision.image_grid)] * n for n in FIXED_COUNTS]
    return GRIDS["qwen2_5_vl" if vision.tower == "qwen2_5_vl" else "pixtral"]


CASES = [
    (name, i)
    for name in sorted(TINY_VLM)
    for i in range(len(tiny_batches(spec_from_hf_dict(TINY_VLM[name]).vision)))  # type: ignore[arg-type]
]


def tower_inputs(vision: VisionSpec, grids: list[tuple[int, int, int]], device: str) -> dict[str, Any]:
    """What the tower's processor hands the model for images of these grids (random pixels)."""
    p = vision.patch_size
    if vision.tower == "qwen2_5_vl":
        table = torch.tensor(grids)
        patches = sum(t * h * w for t, h, w in grids)
        inputs: dict[str, Any] = {"pixel_values": torch.randn(patches, vision.patch_inputs, device=device)}
        inputs["image_grid_thw"] = table
        if device == "meta":  # the rotary positions, computed from the grid by the model's own helper
            inputs["position_ids"] = get_vision_position_ids(table, vision.spatial_merge).to(device)
        return inputs
    if vision.tower == "pixtral":  # one padded canvas, the true sizes beside it
        height, width = max(h for _, h, _ in grids) * p, max(w for _, _, w in grids) * p
        return {
            "pixel_values": torch.randn(len(grids), 3, height, width, device=device),
            "image_sizes": torch.tensor([[h * p, w * p] for _, h, w in grids]),
        }
    side = vision.image_grid[0] * p  # type: ignore[index]
    return {"pixel_values": torch.randn(len(grids), 3, side, side, device=device)}


def windowed_blocks(model: torch.nn.Module) -> set[int]:
    """The blocks the tower itself attends in windows: Qwen2.5-VL's not in fullatt_block_indexes."""
    visual = getattr(getattr(model, "model", model), "visual", None)
    if visual is None:
        return set()
    return {i for i in range(len(visual.blocks)) if i not in visual.fullatt_block_indexes}


def conv_on_real_patches(model: torch.nn.Module, grids: list[tuple[int, int, int]]) -> int:
    """FLOPs of Pixtral's patch convolution on the images' own patches: it convolves the padded
    canvas of the whole batch, and the model then keeps each image's patches only."""
    conv = getattr(model, "model", model).vision_tower.patch_conv
    return 6 * conv.weight.numel() * sum(t * h * w for t, h, w in grids)


def measure(model: torch.nn.Module, vision: VisionSpec, grids: list[tuple[int, int, int]], device: str):
    tally, _ = vm.run_tower(model, vision.tower, tower_inputs(vision, grids, device), backward=True)
    if tally.unread_masks:  # the meta device holds no mask values: count Pixtral's own mask on the CPU
        pairs = vm.block_mask_pairs([t * h * w for t, h, w in grids])
        for block in tally.unread_masks:
            tally.pairs[block] = pairs
    measured = vm.measured_flops(tally, windowed_blocks(model))
    if vision.tower == "pixtral":
        canvas = measured["patch_embedding"]
        measured["patch_embedding"] = conv_on_real_patches(model, grids)
        assert canvas >= measured["patch_embedding"], "the canvas holds every image's patches"
    return tally, measured


# -- tiny towers, forward and backward on the CPU ------------------------------------------------


@functools.cache
def cpu_model(name: str) -> torch.nn.Module:
    torch.manual_seed(0)
    config = hf.config_from_dict(TINY_VLM[name])
    vm.use_counting_attention(config)
    return hf.build(config, "cpu")


@pytest.mark.parametrize("name,batch", CASES)
def test_tiny_tower_flops_per_component_are_the_models(name, batch):
    spec = spec_from_hf_dict(TINY_VLM[name])
    vision = spec.vision
    assert vision is not None
    grids = tiny_batches(vision)[batch]
    model = cpu_model(name)
    tally, measured = measure(model, vision, grids, "cpu")
    assert vision.flops_by_component(batch_sums(vision, grids)) == measured
    # What ran without a gradient is exactly the encoder blocks after the feature layer, and the
    # reader names them: model work leaves them out.
    blocks = sorted(tally.pairs)
    unused = [b for b in blocks if b not in tally.backward_blocks]
    assert unused == blocks[vision.layers :]
    assert sum(tally.forward_only_macs.values()) == sum(tally.block_macs[b] for b in unused)
    assert bool(unused) == any("output unused, no backward" in note for note in spec.not_counted)


@pytest.mark.parametrize("name", sorted(TINY_VLM))
def test_a_loaded_transformers_config_reads_as_its_dict(name):
    assert spec_from_hf_config(hf.config_from_dict(TINY_VLM[name])) == spec_from_hf_dict(TINY_VLM[name])


# -- Qwen2.5-VL's own window index --------------------------------------------------------------

QWEN_GRIDS = [
    [(1, 2, 2)],
    [(1, 16, 16)],  # merged 8 x 8, an exact multiple of the window: no partial window
    [(1, 18, 30), (1, 2, 62)],
    [(4, 22, 10), (1, 100, 136)],
    [(2, 8, 40), (3, 14, 6), (1, 36, 52)],
]


@pytest.mark.parametrize("grids", QWEN_GRIDS, ids=str)
@pytest.mark.parametrize("name", ["qwen2_5_vl_7b.json", "tiny"])
def test_qwen_sums_are_the_windows_and_frames_the_model_cuts(name, grids):
    if name == "tiny":
        vision, cfg = spec_from_hf_dict(TINY_VLM["qwen2_5_vl"]).vision, TINY_VLM["qwen2_5_vl"]["vision_config"]
    else:
        vision = read_hf_config(PUBLISHED_VISION[name]).vision
        cfg = json.loads(PUBLISHED_VISION[name].read_text())["vision_config"]
    assert vision is not None
    table = torch.tensor(grids)
    _, cu_windows = get_vision_window_index(
        table,
        spatial_merge_size=cfg["spatial_merge_size"],
        window_size=cfg["window_size"],
        patch_size=cfg["patch_size"],
    )
    cu_frames = get_vision_cu_seqlens(table)
    sums = batch_sums(vision, grids)
    assert sums["vision_window_sq_sum"] == int((cu_windows.diff().long() ** 2).sum())
    assert sums["vision_sq_sum"] == int((cu_frames.diff().long() ** 2).sum())
    assert sums["vision_patches"] == int(cu_frames[-1]) == int(cu_windows[-1])


# -- the published configs at full size, on the meta device -------------------------------------

PUBLISHED_GRIDS = {
    "qwen2_5_vl": [(1, 36, 52), (2, 20, 28)],  # a 504 x 728 px image and a 4-frame 280 x 392 px video
    "pixtral": [(1, 36, 52), (1, 20, 28)],  # 504 x 728 and 280 x 392 px
}


def published_grids(vision: VisionSpec) -> list[tuple[int, int, int]]:
    if vision.image_grid is not None:
        return [(1, *vision.image_grid)] * 2
    return PUBLISHED_GRIDS["qwen2_5_vl" if vision.tower == "qwen2_5_vl" else "pixtral"]


@functools.cache
def meta_model(name: str) -> torch.nn.Module:
    config = hf.config_from_dict(loadable(json.loads(PUBLISHED_VISION[name].read_text())))
    vm.use_counting_attention(config)
    return hf.build(config, "meta")


def deviation(ours: int, theirs: int) -> float:
    return abs(ours - theirs) / theirs if theirs else float(ours != 0)


@pytest.mark.slow  # Qwen2.5-VL's eager windows: a few thousand attention calls, forward and backward
@pytest.mark.parametrize("name", sorted(PUBLISHED_VISION))
def test_published_tower_per_component_at_full_size(name):
    spec = read_hf_config(PUBLISHED_VISION[name])
    vision = spec.vision
    assert vision is not None
    grids = published_grids(vision)
    _, measured = measure(meta_model(name), vision, grids, "meta")
    ours = vision.flops_by_component(batch_sums(vision, grids))
    worst = {key: deviation(ours[key], measured[key]) for key in COMPONENTS if ours[key] or measured[key]}
    assert max(worst.values()) <= 1e-3, worst  # the brief's tolerance ...
    assert ours == measured  # ... and in fact exact


@pytest.mark.parametrize("name", sorted(PUBLISHED_VISION))
def test_a_loaded_published_config_reads_as_its_file(name):
    config = hf.config_from_dict(loadable(json.loads(PUBLISHED_VISION[name].read_text())))
    assert spec_from_hf_config(config) == read_hf_config(PUBLISHED_VISION[name])
