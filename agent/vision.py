"""A micro-batch's vision sums (packscope.core.vision), on the device and without a host sync.

The sums of a batch's images are elementwise in each image's grid, so a tower that describes its
images by a tensor (Qwen2.5-VL's ``image_grid_thw`` / ``video_grid_thw``, Pixtral's
``image_sizes``) gets them from a handful of kernels whose results stay on the device: 0-d int64
tensors, to be reduced with the interval's other device sums. No ``.item()``, ``.tolist()``,
boolean indexing or data-dependent shape is used; a grid's values are not validated here (that
would read them back), the reference ``packscope.core.vision.grid_sums`` states the rules.

A fixed-size tower (Gemma 3's SigLIP, Llava's CLIP, Llama 4's tiles) needs no device work: its
sums follow from the number of images, a static shape (``pixel_values.shape[0]``), and are
returned as host ints, like the accumulator's other shape-known counts. A padded-rows tower (Gemma
4) is read from its ``image_position_ids`` [images, slots, 2] (-1 marks a padding slot): images and
slots from the shape, the real patches (the keys every slot attends to) on the device. A tiles
tower (mllama) is read from its ``pixel_values``' shape, its ``aspect_ratio_mask`` and its
``cross_attention_mask``, on the device (``tiles_sums``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from packscope.core.vision import (
    CROSS_PAIRS,
    CROSS_SUMS,
    CROSS_TEXT_TOKENS,
    FIXED,
    GRID_THW,
    IMAGE_SIZES,
    PADDED_ROWS,
    TILES,
    VISION_IMAGES,
    VISION_PATCHES,
    VISION_SQ_SUM,
    VISION_SUMS,
    VISION_TOWERS,
    VISION_WINDOW_SQ_SUM,
    VisionSpec,
    batch_sums,
    fixed_image_sums,
    pixels_to_grid,
    tile_tokens,
)

# The batch keys each kind of tower reads (HF processors' names).
BATCH_KEYS: dict[str, tuple[str, ...]] = {
    GRID_THW: ("image_grid_thw", "video_grid_thw"),
    IMAGE_SIZES: ("image_sizes",),
    FIXED: ("pixel_values",),
    PADDED_ROWS: ("image_position_ids", "video_position_ids"),  # video frames are rows like images
    TILES: ("pixel_values", "aspect_ratio_mask", "cross_attention_mask"),  # read together (tiles_sums)
}
# The kinds whose sums follow from a static shape: counted on the host, nothing read from the device.
SHAPE_KINDS = (FIXED,)


def _check_table(name: str, table: torch.Tensor, columns: int) -> torch.Tensor:
    """Shape and dtype only: both are known on the host."""
    if table.dim() != 2 or table.shape[1] != columns:
        raise ValueError(f"{name} must be [images, {columns}], got shape {tuple(table.shape)}")
    if table.dtype.is_floating_point or table.dtype.is_complex or table.dtype == torch.bool:
        raise ValueError(f"{name} must hold integers, got {table.dtype}")
    return table.to(torch.int64)


def _frames_sums(vision: VisionSpec, t: torch.Tensor, h: torch.Tensor, w: torch.Tensor) -> dict[str, torch.Tensor]:
    """The sums of images of t frames of h x w patches (int64 columns), elementwise."""
    frame = h * w
    zero = torch.zeros((), dtype=torch.int64, device=t.device)
    out = {
        **dict.fromkeys(CROSS_SUMS, zero),  # no cross-attention layers read these towers
        VISION_IMAGES: t.sum(),
        VISION_PATCHES: (t * frame).sum(),
        VISION_SQ_SUM: (t * (frame + vision.class_tokens) ** 2).sum(),
    }
    if vision.window is None:
        out[VISION_WINDOW_SQ_SUM] = zero
        return out
    # Windows of W x W merged tokens over each frame's (h/m) x (w/m) merged grid, partial at the
    # edges: Σ over windows of (r·c·m²)² = m⁴ · Σ_rows r² · Σ_cols c² (vision.frame_window_sq).
    m, win = vision.spatial_merge, vision.window
    rows, cols = h // m, w // m
    row_sq = (rows // win) * win * win + (rows % win) ** 2
    col_sq = (cols // win) * win * win + (cols % win) ** 2
    out[VISION_WINDOW_SQ_SUM] = (t * row_sq * col_sq).sum() * m**4
    return out


def grid_thw_sums(vision: VisionSpec, grid_thw: torch.Tensor) -> dict[str, torch.Tensor]:
    """The four sums of images (or videos) given as Qwen2.5-VL's ``image_grid_thw``: an int tensor
    [images, 3] of (t, h, w) in patches, on any device. Returns 0-d int64 tensors on that device."""
    grid = _check_table("image_grid_thw", grid_thw, 3)
    t, h, w = grid.unbind(dim=1)
    return _frames_sums(vision, t, h, w)


def image_sizes_sums(vision: VisionSpec, image_sizes: torch.Tensor) -> dict[str, torch.Tensor]:
    """The four sums of images given as Pixtral's ``image_sizes``: an int tensor [images, 2] of
    (height, width) in pixels. Each image is (height // p) x (width // p) patches, as Pixtral's
    convolution cuts it; the processor resizes images to multiples of p · spatial_merge_size."""
    sizes = _check_table("image_sizes", image_sizes, 2)
    height, width = sizes.unbind(dim=1)
    p = vision.patch_size
    return _frames_sums(vision, torch.ones_like(height), height // p, width // p)


def fixed_sums(vision: VisionSpec, pixel_values: torch.Tensor) -> dict[str, int]:
    """The four sums of a fixed-size tower's ``pixel_values`` [images, channels, H, W] (Llama 4:
    one row per tile), from its static shape: host ints, nothing is read from the device."""
    if vision.image_grid is None:
        raise ValueError(f"a {vision.tower} tower takes images of different sizes: give their grids")
    side = (vision.image_grid[0] * vision.patch_size, vision.image_grid[1] * vision.patch_size)
    if pixel_values.dim() != 4 or tuple(pixel_values.shape[-2:]) != side:
        raise ValueError(
            f"a {vision.tower} tower takes pixel_values [images, channels, {side[0]}, {side[1]}], "
            f"got shape {tuple(pixel_values.shape)}"
        )
    return fixed_image_sums(vision, int(pixel_values.shape[0]))


def rows_sums(vision: VisionSpec, position_ids: torch.Tensor) -> dict[str, Any]:
    """The four sums of a padded-rows tower's images given as ``image_position_ids`` [images, slots, 2]
    ((x, y) of each patch, (-1, -1) for a padding slot): images and slots · images as host ints from
    the shape, and slots · Σ real patches (every slot's query against its image's real keys) as a 0-d
    int64 tensor on the device (``packscope.core.vision.padded_rows_sums`` is the reference)."""
    if position_ids.dim() != 3 or position_ids.shape[-1] != 2:
        raise ValueError(f"image_position_ids must be [images, slots, 2], got shape {tuple(position_ids.shape)}")
    images, slots = int(position_ids.shape[0]), int(position_ids.shape[1])
    real = (position_ids != -1).all(dim=-1).sum(dtype=torch.int64)
    out = {VISION_IMAGES: images, VISION_PATCHES: images * slots, VISION_SQ_SUM: real * slots, VISION_WINDOW_SQ_SUM: 0}
    return {**out, **dict.fromkeys(CROSS_SUMS, 0)}


def tiles_shapes(vision: VisionSpec, batch: Mapping[str, Any]) -> tuple[int, int, int, int] | None:
    """(rows, text tokens, images, tiles) of one micro-batch of a tiles tower (mllama), from the
    shapes of ``pixel_values`` [rows, images, tiles, channels, H, W] (a meta tensor will do),
    ``aspect_ratio_mask`` [rows, images, tiles] and ``cross_attention_mask`` [rows, text, images,
    tiles], all checked; None without ``pixel_values``: the model then skips its cross-attention
    layers. Nothing is read from the device."""
    pixels = batch.get("pixel_values")
    if pixels is None:
        return None
    assert vision.image_grid is not None
    side = (vision.image_grid[0] * vision.patch_size, vision.image_grid[1] * vision.patch_size)
    if pixels.dim() != 6 or tuple(pixels.shape[-2:]) != side:
        raise ValueError(
            f"a {vision.tower} tower takes pixel_values [rows, images, tiles, channels, {side[0]}, {side[1]}], "
            f"got shape {tuple(pixels.shape)}"
        )
    rows, images, tiles = (int(n) for n in pixels.shape[:3])
    tiles_mask, cross = batch.get("aspect_ratio_mask"), batch.get("cross_attention_mask")
    if not isinstance(tiles_mask, torch.Tensor) or tuple(tiles_mask.shape) != (rows, images, tiles):
        got = tuple(tiles_mask.shape) if isinstance(tiles_mask, torch.Tensor) else tiles_mask
        raise ValueError(f"a {vision.tower} tower's aspect_ratio_mask is [{rows}, {images}, {tiles}], got {got}")
    shape = tuple(cross.shape) if isinstance(cross, torch.Tensor) else ()
    if not isinstance(cross, torch.Tensor) or len(shape) != 4 or shape[0] != rows or shape[2:] != (images, tiles):
        raise ValueError(
            f"a {vision.tower} model's cross_attention_mask is [{rows}, text tokens, {images}, {tiles}] (its text "
            f"tokens' count comes from it), got {shape or cross}"
        )
    return rows, int(shape[1]), images, tiles


def tiles_shape_sums(vision: VisionSpec, shapes: tuple[int, int, int, int]) -> dict[str, int]:
    """The sums of a tiles tower's micro-batch that its shapes give (host ints): tile slots, their
    patches, and the text tokens the cross-attention layers run on."""
    rows, text, images, tiles = shapes
    tokens, _ = tile_tokens(vision)
    return {
        VISION_IMAGES: rows * images * tiles,
        VISION_PATCHES: rows * images * tiles * (tokens - vision.projected_class_tokens),
        CROSS_TEXT_TOKENS: rows * text,
    }


def tiles_mask_sums(vision: VisionSpec, tiles_mask: torch.Tensor, cross: torch.Tensor) -> dict[str, torch.Tensor]:
    """The pairs a tiles tower's micro-batch admits, as 0-d int64 tensors on the masks' device: the
    tower's from ``aspect_ratio_mask`` (an image of r real tiles of T admits L² - pad² pairs) and the
    cross-attention's from ``cross_attention_mask`` (a text token's admitted (image, tile) entries,
    all of them when none, x the tile's tokens). An entry admits when it is 1, as transformers reads it."""
    images, tiles = int(tiles_mask.shape[-2]), int(tiles_mask.shape[-1])
    tokens, slots = tile_tokens(vision)
    real = (tiles_mask == 1).sum(dim=-1, dtype=torch.int64)
    pad = (tiles - real) * slots + real * (slots - tokens)
    attended = (cross == 1).sum(dim=(2, 3), dtype=torch.int64)
    return {
        VISION_SQ_SUM: (tiles * slots) ** 2 * real.numel() - (pad * pad).sum(),
        CROSS_PAIRS: torch.where(attended > 0, attended, images * tiles).sum() * tokens,
    }


def tiles_sums(vision: VisionSpec, batch: Mapping[str, Any]) -> dict[str, Any]:
    """The sums of one micro-batch of a tiles tower (mllama), ``packscope.core.vision.tiled_sums`` on
    the device: ``tiles_shape_sums`` (host ints) and ``tiles_mask_sums`` (0-d int64 tensors); zeros
    without ``pixel_values``."""
    out: dict[str, Any] = dict.fromkeys(VISION_SUMS, 0)
    shapes = tiles_shapes(vision, batch)
    if shapes is None:
        return out
    out |= tiles_shape_sums(vision, shapes)
    return out | tiles_mask_sums(vision, batch["aspect_ratio_mask"], batch["cross_attention_mask"])


def _add(total: dict[str, Any], part: Mapping[str, Any]) -> dict[str, Any]:
    return {name: total[name] + part[name] for name in VISION_SUMS}


def batch_vision_sums(vision: VisionSpec, batch: Mapping[str, Any]) -> dict[str, Any]:
    """The four sums of one micro-batch, read from the keys its tower's processor writes
    (``BATCH_KEYS``): 0-d int64 device tensors for a tensor of grids or sizes, host ints for a
    fixed-size tower or for sizes given as a list. A batch without images gives zeros."""
    kind = VISION_TOWERS[vision.tower]
    if kind == TILES:
        return tiles_sums(vision, batch)
    total: dict[str, Any] = dict.fromkeys(VISION_SUMS, 0)
    for key in BATCH_KEYS[kind]:
        value = batch.get(key)
        if value is None:
            continue
        if kind == FIXED:
            total = _add(total, fixed_sums(vision, value))
        elif kind == PADDED_ROWS:
            if len(value):  # an empty host list has no shape to read
                total = _add(total, rows_sums(vision, torch.as_tensor(value)))
        elif not isinstance(value, torch.Tensor):  # a host list of sizes or grids: count on the host
            rows = [tuple(int(x) for x in row) for row in value]
            grids = [pixels_to_grid(vision, h, w) for h, w in rows] if kind == IMAGE_SIZES else rows
            total = _add(total, batch_sums(vision, grids))  # type: ignore[arg-type]
        elif kind == GRID_THW:
            total = _add(total, grid_thw_sums(vision, value))
        else:
            total = _add(total, image_sizes_sums(vision, value))
    return total


__all__ = [
    "BATCH_KEYS",
    "SHAPE_KINDS",
    "batch_vision_sums",
    "fixed_sums",
    "grid_thw_sums",
    "image_sizes_sums",
    "rows_sums",
    "tiles_mask_sums",
    "tiles_shape_sums",
    "tiles_shapes",
    "tiles_sums",
]
