"""The vision tower of a vision-language model: its FLOPs per patch and per image, and the sums
of a batch's images that they multiply (docs/flops.md, "Vision towers").

GEMM work only, forward plus backward, 6 FLOPs per multiply-add, as for the decoder:

    FLOPs_vision = vision_images · c_image + vision_patches · c_lin
                   + vision_sq_sum · c_core_full + vision_window_sq_sum · c_core_window

* ``c_lin`` (per patch): the patch embedding as a GEMM (channels · temporal · p² → hidden), every
  counted encoder block's q/k/v/o and MLP, and the projector (patch merger / multi-modal
  projector) that runs once per token handed to the decoder, i.e. once per ``spatial_merge²``
  patches;
* ``c_image`` (per attention sequence): the class tokens a tower adds to each image (CLIP's,
  Llama 4's) through the encoder blocks, and through the projector where it keeps them;
* ``c_core_full`` / ``c_core_window``: QKᵀ and P·V of the full-attention and the windowed blocks.
  A tower's attention is bidirectional, so every one of the p² (query, key) pairs of a sequence of
  p tokens is computed: 12 · hidden FLOPs per pair and block, not halved as the decoder's causal
  term is.

Not counted: norms, activations, biases, position embeddings (learned, interpolated or rotary),
the class-token concatenation, Gemma 3's average pooling and Llama 4's pixel shuffle (no GEMM),
softmax. A tower that runs layers whose output the model does not use (Llava's
``vision_feature_layer`` -2) counts the layers that feed the features only; the reader names the
rest in ``ModelSpec.not_counted``.

The sums (ints; they travel like the decoder's attention sums) are, over the images of a batch,
each image a grid of t x h x w patches (t frames of h x w; an image is one frame):

* ``vision_images``: Σ t, the tower's attention sequences (one per frame or tile);
* ``vision_patches``: Σ t·h·w;
* ``vision_sq_sum``: Σ t·(h·w + class tokens)², the full-attention blocks (every frame attends
  within itself: transformers' ``get_vision_cu_seqlens`` with ``merge_temporal=False``);
* ``vision_window_sq_sum``: Σ over windows of w², the windowed blocks (Qwen2.5-VL), windows as
  transformers' ``get_vision_window_index`` cuts them: squares of ``window`` x ``window`` merged
  tokens on each frame's merged grid (h/m x w/m), partial windows at the bottom and right edges,
  each window of r x c merged tokens holding r·c·m² patches. Per frame that is
  m⁴ · chunk_sq(h/m, window) · chunk_sq(w/m, window), elementwise in (t, h, w).

Pure Python, like the rest of ``packscope.core``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from packscope.core.attention import chunk_sq
from packscope.core.model_fields import check_bool, check_flags, check_int, check_optional_int, dict_fields

# Do not rename: the agent, the wire record and the database carry these names.
VISION_IMAGES = "vision_images"
VISION_PATCHES = "vision_patches"
VISION_SQ_SUM = "vision_sq_sum"
VISION_WINDOW_SQ_SUM = "vision_window_sq_sum"
# A tower whose features the decoder reads through cross-attention layers (mllama): those layers
# run only in micro-batches with images; their text-side work and their (query, key) pairs.
CROSS_TEXT_TOKENS = "cross_text_tokens"
CROSS_PAIRS = "cross_pairs"
CROSS_SUMS = (CROSS_TEXT_TOKENS, CROSS_PAIRS)
VISION_SUMS = (VISION_IMAGES, VISION_PATCHES, VISION_SQ_SUM, VISION_WINDOW_SQ_SUM, *CROSS_SUMS)

# How each tower's batch describes its images (what the agent reads):
#   grid_thw:     an int tensor [images, 3] of (t, h, w) in patches (``image_grid_thw``, ``video_grid_thw``);
#   image_sizes:  an int tensor [images, 2] of (height, width) in pixels (``image_sizes``);
#   fixed:        every image (or tile, or crop) is ``image_grid``: the count is pixel_values.shape[0];
#   padded_rows:  ``pixel_values`` [images, slots, patch values], every image's patches padded to the
#                 batch's slots (Gemma 4's processor pads each to ``max_soft_tokens`` · pooling²);
#   tiles:        ``pixel_values`` [rows, images, tiles, channels, H, W] of fixed-size tiles, every tile
#                 slot run whether the image fills it or not, all tiles of an image attending together,
#                 with ``aspect_ratio_mask`` [rows, images, tiles] and ``cross_attention_mask``
#                 [rows, text, images, tiles] beside (mllama: ``tiled_sums``).
GRID_THW, IMAGE_SIZES, FIXED, PADDED_ROWS, TILES = "grid_thw", "image_sizes", "fixed", "padded_rows", "tiles"
VISION_TOWERS: dict[str, str] = {
    "qwen2_5_vl": GRID_THW,  # Qwen2.5-VL's ViT with windowed blocks and a 2x2 patch merger
    "pixtral": IMAGE_SIZES,  # Mistral 3's Pixtral: variable-size images, block-diagonal attention
    "siglip": FIXED,  # Gemma 3's SigLIP (896² → 64 x 64 patches, pooled 4 x 4)
    "clip": FIXED,  # Llava's CLIP, with a class token
    "llama4": FIXED,  # Llama 4's tiles (336² → 24 x 24 patches + a class token, pixel-shuffled 2 x 2)
    # Read off the modules by the structural count (packscope.agent.hf_towers): full attention per frame
    "qwen3_vl": GRID_THW,  # Qwen3-VL's ViT: a 2x2 patch merger and the deepstack mergers
    "qwen3_5": GRID_THW,  # Qwen3.5's ViT: Qwen3-VL's without deepstack
    "internvl": FIXED,  # InternViT: 448² tiles of 32 x 32 patches + a class token, pixel-shuffled 2 x 2
    "gemma4": PADDED_ROWS,  # Gemma 4's ViT: pre-cut patches padded per image, pooled 3 x 3
    "mllama": TILES,  # Llama 3.2 Vision: local + gated global encoders over each image's tiles, cross-attention
    # Gemma 3n's timm MobileNet-V5 (768² images → 16 x 16 soft tokens): convolutions and multi-query
    # attention at a fixed input size, its work per image read off the modules (image_macs)
    "mobilenetv5": FIXED,
}
VISION_COMPONENTS = ("patch_embedding", "attention", "mlp", "projector")
# A convolutional tower's work per image, by component (VisionSpec.image_macs): its convolutions
# (stem, inverted-residual and edge-residual blocks), its attention blocks' projections (the
# key/value downsampling included), their QKᵀ and P·V, and the multi-scale fusion adapter.
IMAGE_MAC_COMPONENTS = ("conv", "attention", "core_full", "fusion")
MAX_IMAGE_MACS = 2**56  # an image's work exceeds a width's bound; 6 x this stays within a measured coefficient's
_CROSS_FIELDS = ("cross_layers", "cross_hidden", "cross_width", "cross_kv_width", "cross_ffn", "cross_gated")


@dataclass(frozen=True)
class VisionSpec:
    """What the FLOPs formula needs to know about a vision tower and its projector.

    ``layers`` are the encoder blocks whose output the model uses (the counted ones);
    ``windowed_layers`` flags which of them attend in windows (None: all full). ``projector``
    lists the (in, out) widths of every GEMM that runs once per token handed to the decoder;
    ``spatial_merge`` is the side of the square of patches that becomes one such token (a 2 x 2
    merger, Gemma 3's 4 x 4 pooling, Llama 4's 2 x 2 pixel shuffle; 1: none).
    """

    tower: str
    layers: int
    hidden: int
    heads: int
    ffn: int
    gated: bool  # three MLP matrices (Qwen2.5-VL, Pixtral) or two (SigLIP, CLIP, Llama 4)
    patch_size: int  # pixels per patch side
    patch_inputs: int  # values one patch embedding reads: channels · temporal patch · patch_size²
    spatial_merge: int = 1
    projector: tuple[tuple[int, int], ...] = ()
    class_tokens: int = 0  # tokens the encoder adds to every image (CLIP's, Llama 4's class token)
    projected_class_tokens: int = 0  # of those, the ones the projector also runs on (Llava's "full")
    image_grid: tuple[int, int] | None = None  # (h, w) in patches of every image of a fixed-size tower
    window: int | None = None  # windowed blocks' window side, in merged tokens (Qwen2.5-VL)
    windowed_layers: tuple[int, ...] | None = None  # one 0/1 flag per counted block; None: all full
    # The decoder's cross-attention layers that read the tower's tokens (mllama), 0 without: their
    # count, the decoder's hidden size (q and o per text token; k and v read the projector's tokens,
    # of that size), the attention width (heads · head_dim: q, o, QKᵀ and P·V), k's and v's width
    # (key/value heads · head_dim), and the MLP's width and matrices (three when gated).
    cross_layers: int = 0
    cross_hidden: int = 0
    cross_width: int = 0
    cross_kv_width: int = 0
    cross_ffn: int = 0
    cross_gated: bool = False
    # A convolutional tower's multiply-adds per image at its fixed input size, by IMAGE_MAC_COMPONENTS
    # (MobileNet-V5): they replace the block formula, which prices transformer blocks; the projector
    # stays per token. Empty for every other tower.
    image_macs: tuple[tuple[str, int], ...] = ()

    def __post_init__(self) -> None:
        if self.tower not in VISION_TOWERS:
            raise ValueError(f"vision field 'tower' must be one of {', '.join(VISION_TOWERS)}, got {self.tower!r}")
        for key in ("layers", "hidden", "heads", "ffn", "patch_size", "patch_inputs", "spatial_merge"):
            check_int(f"vision.{key}", getattr(self, key), minimum=1)
        check_bool("vision.gated", self.gated)
        check_int("vision.class_tokens", self.class_tokens, minimum=0)
        check_int("vision.projected_class_tokens", self.projected_class_tokens, minimum=0)
        check_optional_int("vision.window", self.window, minimum=1)
        self._check_cross()
        self._check_image_macs()
        if self.projected_class_tokens > self.class_tokens:
            raise ValueError("vision.projected_class_tokens cannot exceed vision.class_tokens")
        if self.hidden % self.heads:
            raise ValueError(f"vision.hidden ({self.hidden}) is not divisible by vision.heads ({self.heads})")
        object.__setattr__(self, "projector", _check_projector(self.projector))
        self._check_grid()
        self._check_windows()
        if (6 * self.projector_macs) % (self.spatial_merge**2):
            raise ValueError(
                f"the projector's {self.projector_macs} multiply-adds per token are not a whole number of FLOPs "
                f"per patch over {self.spatial_merge**2} patches; packscope counts whole FLOPs per patch"
            )

    def _check_cross(self) -> None:
        sizes = _CROSS_FIELDS[:-1]
        for key in sizes:
            check_int(f"vision.{key}", getattr(self, key), minimum=0)
        check_bool("vision.cross_gated", self.cross_gated)
        tiles = VISION_TOWERS[self.tower] == TILES
        given = [key for key in _CROSS_FIELDS if getattr(self, key)]
        if tiles and not all(getattr(self, key) for key in sizes):
            raise ValueError(f"a {self.tower} tower needs its cross-attention layers: {', '.join(sizes)} >= 1")
        if not tiles and given:
            raise ValueError(f"a {self.tower} tower has no cross-attention layers ({', '.join(given)} given)")
        if tiles and self.projected_class_tokens != 1:
            raise ValueError(f"a {self.tower} tower hands over each tile's class token: projected_class_tokens 1")

    def _check_image_macs(self) -> None:
        convolutional = self.tower == "mobilenetv5"
        value = self.image_macs
        if not isinstance(value, (list, tuple)):
            raise ValueError(f"vision.image_macs must be a list of [component, multiply-adds], got {value!r}")
        pairs = []
        for i, pair in enumerate(value):
            if (
                not isinstance(pair, (list, tuple))
                or len(pair) != 2
                or pair[0] not in IMAGE_MAC_COMPONENTS
                or isinstance(pair[1], bool)
                or not isinstance(pair[1], int)
                or not 0 <= pair[1] <= MAX_IMAGE_MACS
            ):
                raise ValueError(
                    f"vision.image_macs[{i}] must be [component, multiply-adds from 0 to {MAX_IMAGE_MACS}], a "
                    f"component one of {', '.join(IMAGE_MAC_COMPONENTS)}; got {pair!r}"
                )
            pairs.append((pair[0], pair[1]))
        if len({name for name, _ in pairs}) != len(pairs):
            raise ValueError("vision.image_macs names a component twice")
        if convolutional != bool(pairs):
            need = "needs" if convolutional else "takes no"
            raise ValueError(f"a {self.tower} tower {need} vision.image_macs (its work per image)")
        if convolutional and (self.class_tokens or self.window is not None):
            raise ValueError(f"a {self.tower} tower has no class tokens and no windows")
        object.__setattr__(self, "image_macs", tuple(pairs))

    def _check_grid(self) -> None:
        fixed = VISION_TOWERS[self.tower] in (FIXED, TILES)
        if fixed != (self.image_grid is not None):
            need = "needs" if fixed else "takes no"
            raise ValueError(f"a {self.tower} tower {need} vision.image_grid (fixed patches per image)")
        if self.image_grid is None:
            return
        grid = tuple(self.image_grid) if isinstance(self.image_grid, (list, tuple)) else ()
        if len(grid) != 2:
            raise ValueError(f"vision.image_grid must be [h, w] in patches, got {self.image_grid!r}")
        for side in grid:
            check_int("vision.image_grid", side, minimum=1)
            if side % self.spatial_merge:
                raise ValueError(f"vision.image_grid {grid} is not a multiple of spatial_merge {self.spatial_merge}")
        object.__setattr__(self, "image_grid", grid)

    def _check_windows(self) -> None:
        if self.windowed_layers is not None:
            flags = check_flags("vision.windowed_layers", self.windowed_layers, self.layers)
            object.__setattr__(self, "windowed_layers", flags if any(flags) else None)
        if (self.window is None) != (self.windowed_layers is None):
            raise ValueError("vision.window and vision.windowed_layers go together: windowed blocks need a window")

    # -- derived sizes -------------------------------------------------------------------------
    @property
    def fixed_size(self) -> bool:
        return self.image_grid is not None

    @property
    def window_layer_count(self) -> int:
        return sum(self.windowed_layers) if self.windowed_layers is not None else 0

    @property
    def full_layer_count(self) -> int:
        return self.layers - self.window_layer_count

    @property
    def projector_macs(self) -> int:
        """Multiply-adds of the projector per token handed to the decoder."""
        return sum(i * o for i, o in self.projector)

    @property
    def block_macs(self) -> int:
        """Multiply-adds per token of one encoder block: q, k, v, o (each hidden x hidden) and the MLP."""
        h = self.hidden
        return 4 * h * h + (3 if self.gated else 2) * h * self.ffn

    # -- the formula ---------------------------------------------------------------------------
    @property
    def c_lin_by_component(self) -> dict[str, int]:
        """FLOPs per patch (forward + backward), by VISION_COMPONENTS; the projector's share is its
        per-token work over the spatial_merge² patches of one token."""
        h, f = self.hidden, 3 if self.gated else 2
        if self.image_macs:  # a convolutional tower: its work is per image (c_image_by_component)
            zero = dict.fromkeys(VISION_COMPONENTS, 0)
            return {**zero, "projector": 6 * self.projector_macs // self.spatial_merge**2}
        out = {
            "patch_embedding": 6 * self.patch_inputs * h,
            "attention": 6 * self.layers * 4 * h * h,
            "mlp": 6 * self.layers * f * h * self.ffn,
            "projector": 6 * self.projector_macs // self.spatial_merge**2,
        }
        if self.cross_layers:  # every patch's token through each cross-attention layer's k and v
            out["cross_attention"] = 6 * self.cross_layers * self.cross_kv_macs
        return out

    @property
    def c_lin(self) -> int:
        return sum(self.c_lin_by_component.values())

    @property
    def c_image_by_component(self) -> dict[str, int]:
        """FLOPs per attention sequence (image, tile or frame), by component: its class tokens
        through the encoder blocks, and through the projector where the model keeps them."""
        h, f, e = self.hidden, 3 if self.gated else 2, self.class_tokens
        if self.image_macs:  # a convolutional tower: everything but the projector, per image
            return {**dict.fromkeys(VISION_COMPONENTS, 0), **{k: 6 * v for k, v in self.image_macs}}
        out = {
            "patch_embedding": 0,
            "attention": 6 * e * self.layers * 4 * h * h,
            "mlp": 6 * e * self.layers * f * h * self.ffn,
            "projector": 6 * self.projected_class_tokens * self.projector_macs,
        }
        if self.cross_layers:  # the class tokens handed over, through k and v
            out["cross_attention"] = 6 * self.cross_layers * self.projected_class_tokens * self.cross_kv_macs
        return out

    @property
    def c_image(self) -> int:
        return sum(self.c_image_by_component.values())

    @property
    def c_core_by_kind(self) -> dict[str, int]:
        """FLOPs per unit of each attention sum: 12 · hidden per (query, key) pair and block
        (QKᵀ and P·V over all heads, forward + backward, every pair: bidirectional). A convolutional
        tower has none: its attention's pairs are fixed per image (c_image_by_component)."""
        if self.image_macs:
            return {}
        out = {"full": 12 * self.hidden * self.full_layer_count, "window": 12 * self.hidden * self.window_layer_count}
        return {kind: value for kind, value in out.items() if value}

    @property
    def c_by_sum(self) -> dict[str, int]:
        """The coefficient of each sum (VISION_SUMS); a sum whose coefficient is 0 is left out."""
        core = self.c_core_by_kind
        out = {
            VISION_IMAGES: self.c_image,
            VISION_PATCHES: self.c_lin,
            VISION_SQ_SUM: core.get("full", 0),
            VISION_WINDOW_SQ_SUM: core.get("window", 0),
            **self.c_cross,
        }
        return {name: value for name, value in out.items() if value}

    @property
    def cross_qo_macs(self) -> int:
        """Multiply-adds of one cross-attention layer's q and o per text token."""
        return 2 * self.cross_hidden * self.cross_width

    @property
    def cross_kv_macs(self) -> int:
        """Multiply-adds of one cross-attention layer's k and v per image token (of the decoder's size)."""
        return 2 * self.cross_hidden * self.cross_kv_width

    @property
    def cross_mlp_macs(self) -> int:
        """Multiply-adds of one cross-attention layer's MLP per text token."""
        return (3 if self.cross_gated else 2) * self.cross_hidden * self.cross_ffn

    @property
    def c_cross(self) -> dict[str, int]:
        """The cross-attention layers' coefficients: per text token of a micro-batch with images (q, o
        and the MLP of each layer) and per (query, key) pair (12 · width per layer: QKᵀ and P·V,
        forward and backward); empty for a tower without such layers."""
        n = self.cross_layers
        if not n:
            return {}
        return {
            CROSS_TEXT_TOKENS: 6 * n * (self.cross_qo_macs + self.cross_mlp_macs),
            CROSS_PAIRS: 12 * n * self.cross_width,
        }

    def flops(self, sums: Mapping[str, Any]) -> Any:
        return vision_flops(sums, self.c_by_sum)

    def flops_split(self, sums: Mapping[str, Any]) -> dict[str, Any]:
        """FLOPs of ``sums`` by term: ``linear`` (patches · c_lin), ``class_tokens`` (images · c_image),
        ``full`` and ``window`` (the attention sums); terms without a coefficient are left out."""
        c = self.c_by_sum
        terms = {"linear": VISION_PATCHES, "class_tokens": VISION_IMAGES, "full": VISION_SQ_SUM}
        terms["window"] = VISION_WINDOW_SQ_SUM
        terms |= {"cross_text": CROSS_TEXT_TOKENS, "cross_pairs": CROSS_PAIRS}
        return {term: sums[name] * c[name] for term, name in terms.items() if name in c}

    def flops_by_component(self, sums: Mapping[str, int]) -> dict[str, int]:
        """FLOPs of ``sums`` by what does the work: the GEMMs of VISION_COMPONENTS (patches and class
        tokens together) and QKᵀ + P·V of the full (``core_full``) and windowed (``core_window``) blocks."""
        per_patch, per_image = self.c_lin_by_component, self.c_image_by_component
        out = {
            key: sums[VISION_PATCHES] * per_patch[key] + sums[VISION_IMAGES] * per_image[key]
            for key in VISION_COMPONENTS
        }
        core = self.c_core_by_kind
        out["core_full"] = sums[VISION_SQ_SUM] * core.get("full", 0)
        out["core_window"] = sums[VISION_WINDOW_SQ_SUM] * core.get("window", 0)
        if self.image_macs:  # the convolutional tower's own components, per image
            for key in IMAGE_MAC_COMPONENTS:
                if key not in VISION_COMPONENTS:  # attention is among those, counted above
                    out[key] = out.get(key, 0) + sums[VISION_IMAGES] * per_image[key]
        if self.cross_layers:
            n, text = self.cross_layers, sums[CROSS_TEXT_TOKENS]
            out["cross_attention"] = (
                sums[VISION_PATCHES] * per_patch["cross_attention"]
                + sums[VISION_IMAGES] * per_image["cross_attention"]
                + text * 6 * n * self.cross_qo_macs
            )
            out["cross_mlp"] = text * 6 * n * self.cross_mlp_macs
            out["core_cross"] = sums[CROSS_PAIRS] * 12 * n * self.cross_width
        return out

    # -- (de)serialisation for the wire ----------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["projector"] = [list(pair) for pair in self.projector]
        out["image_grid"] = list(self.image_grid) if self.image_grid is not None else None
        out["windowed_layers"] = list(self.windowed_layers) if self.windowed_layers is not None else None
        if not self.cross_layers:  # a tower without cross-attention writes the dict it always wrote
            for key in _CROSS_FIELDS:
                del out[key]
        if self.image_macs:  # written for a convolutional tower only
            out["image_macs"] = [list(pair) for pair in self.image_macs]
        else:
            del out["image_macs"]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> VisionSpec:
        """A tower from its JSON object, strictly: unknown and missing fields are named, integers
        are integers (not bools, not strings), lists are checked entry by entry."""
        return cls(**dict_fields("model vision", cls, data, ("image_grid", "windowed_layers", "image_macs")))


def _check_projector(value: Any) -> tuple[tuple[int, int], ...]:
    if not isinstance(value, (list, tuple)):
        raise ValueError(f"vision field 'projector' must be a list of [in, out] pairs, got {value!r}")
    pairs = []
    for i, pair in enumerate(value):
        if not isinstance(pair, (list, tuple)) or len(pair) != 2:
            raise ValueError(f"vision.projector[{i}] must be an [in, out] pair, got {pair!r}")
        pairs.append((check_int(f"vision.projector[{i}]", pair[0], 1), check_int(f"vision.projector[{i}]", pair[1], 1)))
    return tuple(pairs)


def vision_flops(sums: Mapping[str, Any], c_by_sum: Mapping[str, Any]) -> Any:
    """Σ sum · coefficient over the sums with a coefficient (``VisionSpec.c_by_sum``). Only + and *:
    ints, floats, numpy arrays and SQL expressions alike; a sum without a coefficient is not read."""
    total: Any = 0
    for name in VISION_SUMS:
        coefficient = c_by_sum.get(name)
        if coefficient:
            total = total + sums[name] * coefficient
    return total


# -- the reference sums ----------------------------------------------------------------------------


def _positive(value: Any, what: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{what} is an integer >= 1, got {value!r}")
    return value


def frame_window_sq(vision: VisionSpec, h: int, w: int) -> int:
    """Σ over the windows of one h x w frame (in patches) of their squared patch counts."""
    if vision.window is None:
        return 0
    m = vision.spatial_merge
    return m**4 * chunk_sq(h // m, vision.window) * chunk_sq(w // m, vision.window)


def grid_sums(vision: VisionSpec, grid: tuple[int, int, int]) -> dict[str, int]:
    """The four sums of one image (or video) of t x h x w patches."""
    if not isinstance(grid, (list, tuple)) or len(grid) != 3:
        raise ValueError(f"an image grid is (t, h, w) in patches, got {grid!r}")
    t, h, w = (_positive(x, f"an image grid's {axis}") for x, axis in zip(grid, "thw", strict=True))
    if VISION_TOWERS[vision.tower] == TILES:
        raise ValueError(f"a {vision.tower} tower's images are tiles of a micro-batch: give them as tiled_sums does")
    m = vision.spatial_merge
    if h % m or w % m:
        raise ValueError(
            f"an image of {h} x {w} patches does not divide into the tower's {m} x {m} merge blocks "
            "(its processor resizes images to multiples of patch_size · spatial_merge_size)"
        )
    fixed = vision.image_grid
    if fixed is not None and ((h, w) != fixed or t != 1):
        raise ValueError(f"every image of a {vision.tower} tower is 1 x {fixed[0]} x {fixed[1]} patches")
    if VISION_TOWERS[vision.tower] != GRID_THW and t != 1:
        raise ValueError(f"a {vision.tower} tower takes images, one frame each; got t = {t}")
    return {
        VISION_IMAGES: t,
        VISION_PATCHES: t * h * w,
        VISION_SQ_SUM: t * (h * w + vision.class_tokens) ** 2,
        VISION_WINDOW_SQ_SUM: t * frame_window_sq(vision, h, w),
        **dict.fromkeys(CROSS_SUMS, 0),  # no cross-attention layers read these towers
    }


def batch_sums(vision: VisionSpec, grids: Iterable[tuple[int, int, int]]) -> dict[str, int]:
    """The four sums of a batch's images, each a (t, h, w) grid in patches."""
    out = dict.fromkeys(VISION_SUMS, 0)
    for grid in grids:
        for name, value in grid_sums(vision, grid).items():
            out[name] += value
    return out


def fixed_image_sums(vision: VisionSpec, images: int) -> dict[str, int]:
    """The four sums of ``images`` images (tiles, crops) of a fixed-size tower: host ints, since the
    count is a static shape (``pixel_values.shape[0]``)."""
    if vision.image_grid is None:
        raise ValueError(f"a {vision.tower} tower's images differ in size: give their grids")
    if isinstance(images, bool) or not isinstance(images, int) or images < 0:
        raise ValueError(f"an image count is an integer >= 0, got {images!r}")
    if images == 0:
        return dict.fromkeys(VISION_SUMS, 0)
    one = grid_sums(vision, (1, *vision.image_grid))
    return {name: images * value for name, value in one.items()}


def padded_rows_sums(vision: VisionSpec, grids: Iterable[tuple[int, int]], slots: int | None = None) -> dict[str, int]:
    """The four sums of a padded-rows tower's images (Gemma 4), each of h x w patches padded to
    ``slots`` (None: each image fills its own h · w slots, unpadded). Every slot goes through the
    GEMMs; every slot's query attends to its image's h · w real keys (the padding keys are masked);
    the projector is priced per slot / merge² (it runs on the real pooled tokens only: docs/flops.md,
    "Vision towers", says what that over-counts on a padded image)."""
    if VISION_TOWERS[vision.tower] != PADDED_ROWS:
        raise ValueError(f"a {vision.tower} tower's images are not padded rows of patches")
    out = dict.fromkeys(VISION_SUMS, 0)
    m2 = vision.spatial_merge**2
    for grid in grids:
        if not isinstance(grid, (list, tuple)) or len(grid) != 2:
            raise ValueError(f"an image is (h, w) in patches, got {grid!r}")
        h, w = (_positive(x, f"an image's {axis}") for x, axis in zip(grid, "hw", strict=True))
        n = h * w if slots is None else _positive(slots, "a slot count")
        if n < h * w or n % m2:
            raise ValueError(
                f"an image of {h} x {w} patches in {n} slots: the slots must hold it and pool into the tower's "
                f"{vision.spatial_merge} x {vision.spatial_merge} blocks (max_soft_tokens · pooling_kernel_size²)"
            )
        out[VISION_IMAGES] += 1
        out[VISION_PATCHES] += n
        out[VISION_SQ_SUM] += n * h * w
    return out


def tile_tokens(vision: VisionSpec) -> tuple[int, int]:
    """(tokens a tile hands the decoder: its patches and class token; slots a tile fills in the
    tower: those, padded to a multiple of 8 as transformers' mllama pads them)."""
    if vision.image_grid is None or VISION_TOWERS[vision.tower] != TILES:
        raise ValueError(f"a {vision.tower} tower's images are not tiles")
    patches = vision.image_grid[0] * vision.image_grid[1]
    return patches + vision.projected_class_tokens, patches + vision.class_tokens


def tiled_sums(
    vision: VisionSpec,
    batch: tuple[int, int, int, int],
    real_tiles: Iterable[int] | None = None,
    attended: Iterable[int] | None = None,
) -> dict[str, int]:
    """The sums of one micro-batch of a tiles tower (mllama): ``batch`` is (rows, text tokens per row,
    images per row, tiles per image), the shapes of ``pixel_values`` [rows, images, tiles, ...] and
    ``cross_attention_mask`` [rows, text, images, tiles].

    * The tower runs every tile slot, filled or not: each image is one sequence of tiles x slots
      (a tile's patches, its class token and the padding to a multiple of 8) through the local and
      the global encoders. Its mask (from ``aspect_ratio_mask``) masks a (query, key) pair only
      when both are padding (an empty tile's slots, a tile's pad slots): an image of r real tiles
      of T admits L² - pad² pairs, L = T · slots, pad = (T - r) · slots + r · (slots - tokens).
      ``real_tiles``: r of each image, rows x images of them (None: every tile real).
    * The cross-attention layers run on every text token of the micro-batch; a token attends to
      the (P + 1) tokens of each (image, tile) its row of the mask admits, and to all of them when
      it admits none (transformers then zeroes the row's mask). ``attended``: the (image, tile)
      entries each text token admits, rows x text of them (None: no mask given, all admitted)."""
    names = ("rows", "text", "images", "tiles")
    rows, text, images, tiles = (_positive(x, what) for x, what in zip(batch, names, strict=True))
    tokens, slots = tile_tokens(vision)
    reals = [tiles] * (rows * images) if real_tiles is None else list(real_tiles)
    if len(reals) != rows * images or any(
        isinstance(r, bool) or not isinstance(r, int) or not 0 <= r <= tiles for r in reals
    ):
        raise ValueError(f"real tiles: one count 0..{tiles} for each of the {rows} x {images} images, got {reals!r}")
    length = tiles * slots
    sq = sum(length**2 - ((tiles - r) * slots + r * (slots - tokens)) ** 2 for r in reals)
    keys = images * tiles
    if attended is None:
        pairs = rows * text * keys * tokens
    else:
        counts = list(attended)
        if len(counts) != rows * text or any(
            isinstance(a, bool) or not isinstance(a, int) or not 0 <= a <= keys for a in counts
        ):
            raise ValueError(
                f"attended tiles: one count 0..{keys} for each of the {rows} x {text} text tokens, got {counts!r}"
            )
        pairs = sum(a or keys for a in counts) * tokens
    out = dict.fromkeys(VISION_SUMS, 0)
    out |= {
        VISION_IMAGES: rows * images * tiles,
        VISION_PATCHES: rows * images * tiles * (tokens - vision.projected_class_tokens),
        VISION_SQ_SUM: sq,
        CROSS_TEXT_TOKENS: rows * text,
        CROSS_PAIRS: pairs,
    }
    return out


def decoder_tokens(vision: VisionSpec, sums: Mapping[str, int], real_patches: int | None = None) -> int:
    """The tokens the tower hands the decoder for images of these sums: one per spatial_merge²
    patches, plus the class tokens the projector keeps (they are the images' share of the packs). A
    padded-rows tower hands over its real patches' pooled tokens only: give ``real_patches``. A
    tiles tower (mllama) hands its tokens to cross-attention layers: none to the decoder's sequence."""
    if VISION_TOWERS[vision.tower] == TILES:
        return 0
    if real_patches is not None:
        return real_patches // vision.spatial_merge**2
    return sums[VISION_PATCHES] // vision.spatial_merge**2 + sums[VISION_IMAGES] * vision.projected_class_tokens


def pixels_to_grid(vision: VisionSpec, height: int, width: int) -> tuple[int, int, int]:
    """An image of height x width pixels as the tower patches it: (1, height // p, width // p)
    (Pixtral's convolution drops a partial patch; Qwen2.5-VL's processor resizes to multiples)."""
    p = vision.patch_size
    return 1, _positive(height, "an image height") // p, _positive(width, "an image width") // p


__all__ = [
    "CROSS_PAIRS",
    "CROSS_SUMS",
    "CROSS_TEXT_TOKENS",
    "FIXED",
    "GRID_THW",
    "IMAGE_MAC_COMPONENTS",
    "IMAGE_SIZES",
    "PADDED_ROWS",
    "TILES",
    "VISION_COMPONENTS",
    "VISION_IMAGES",
    "VISION_PATCHES",
    "VISION_SQ_SUM",
    "VISION_SUMS",
    "VISION_TOWERS",
    "VISION_WINDOW_SQ_SUM",
    "VisionSpec",
    "batch_sums",
    "decoder_tokens",
    "fixed_image_sums",
    "frame_window_sq",
    "grid_sums",
    "padded_rows_sums",
    "pixels_to_grid",
    "tile_tokens",
    "tiled_sums",
    "vision_flops",
]
