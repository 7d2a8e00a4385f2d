"""One reader per vision tower: a multimodal config's ``vision_config`` (and the wrapper's own
fields) to a :class:`VisionSpec`, following transformers 5.24's modeling code for each tower
(docs/flops.md, "Vision towers").

Supported: Qwen2.5-VL's ViT (``qwen2_5_vl``), Gemma 3's SigLIP (``gemma3``), Llama 4's vision
model (``llama4``), Mistral 3's Pixtral (``mistral3``) and Llava with a CLIP, SigLIP or Pixtral
tower (``llava``). Any other tower is refused by name. Each reader returns the tower and notes of
what runs but is not counted (layers after the feature layer, an unused pooling head).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from packscope.core.hf_defaults import VISION_DEFAULTS, WRAPPER_DEFAULTS
from packscope.core.hf_fields import COUNT_FIELDS, ConfigFields, HFConfigError
from packscope.core.vision import VisionSpec

# Vision fields that change the count; one set but not read by the tower's reader is refused.
VISION_COUNT_FIELDS = COUNT_FIELDS | {
    "depth",
    "num_heads",
    "num_channels",
    "in_channels",
    "patch_size",
    "image_size",
    "temporal_patch_size",
    "spatial_merge_size",
    "window_size",
    "fullatt_block_indexes",
    "out_hidden_size",
    "vision_use_head",
    "pixel_shuffle_ratio",
    "projector_input_dim",
    "projector_output_dim",
    "vision_output_dim",
    "deepstack_visual_indexes",
    "num_position_embeddings",
}

# The vision model types each wrapper accepts in vision_config, the first being transformers'
# default when vision_config names none.
TOWER_TYPES: dict[str, tuple[str, ...]] = {
    "qwen2_5_vl": ("qwen2_5_vl_vision", "qwen2_5_vl"),  # old checkpoints carry the wrapper's type
    "gemma3": ("siglip_vision_model",),
    "llama4": ("llama4_vision_model",),
    "mistral3": ("pixtral",),
    "llava": ("clip_vision_model", "siglip_vision_model", "pixtral"),
}


def _tower_fields(cfg: Mapping[str, Any], mt: str) -> ConfigFields:
    vision = cfg.get("vision_config")
    if vision is None:
        raise HFConfigError(
            f"{mt} config.json: 'vision_config' is missing; transformers would build its default tower, "
            "which is not the checkpoint's: give the checkpoint's vision_config"
        )
    if not isinstance(vision, Mapping):
        raise HFConfigError(f"{mt} config.json: 'vision_config' must be an object, got {vision!r}")
    if not vision:  # every size would be transformers' default tower, not the checkpoint's
        raise HFConfigError(
            f"{mt} config.json: 'vision_config' is empty; transformers would build its default tower, "
            "which is not the checkpoint's: give the checkpoint's vision_config"
        )
    allowed = TOWER_TYPES[mt]
    tower_type = vision.get("model_type", allowed[0])
    if tower_type not in allowed:
        raise HFConfigError(
            f"{mt} config.json: 'vision_config.model_type' {tower_type!r} is a vision tower packscope does not "
            f"count; it counts {', '.join(allowed)} here"
        )
    defaults_key = "qwen2_5_vl_vision" if tower_type == "qwen2_5_vl" else tower_type
    return ConfigFields(vision, defaults_key, VISION_DEFAULTS[defaults_key], "vision_config.")


def _heads(f: ConfigFields, key: str = "num_attention_heads", aliases: tuple[str, ...] = ()) -> int:
    heads = f.integer(key, aliases=aliases)
    hidden = f.integer("hidden_size")
    if hidden % heads:
        raise f.error(key, f"({heads}) must divide hidden_size ({hidden})")
    return heads


def _grid_side(f: ConfigFields) -> int:
    """Patches per side of a fixed-size tower's image (its convolution drops a partial patch)."""
    side = f.integer("image_size") // f.integer("patch_size")
    if side < 1:
        raise f.error("image_size", "is smaller than one patch")
    return side


def _feature_layers(wrapper: ConfigFields, layers: int, allow_list: bool) -> tuple[int, int]:
    """(blocks whose output feeds the projector, feature layers concatenated), from the wrapper's
    ``vision_feature_layer``: hidden state k is the output of block k (0: the embeddings), negative
    k counts from the end of the ``layers`` + 1 states, and the deepest one decides."""
    value = wrapper.raw("vision_feature_layer")
    picks = value if isinstance(value, list) and allow_list else [value]
    if not picks or any(isinstance(k, bool) or not isinstance(k, int) for k in picks):
        what = "an integer or a list of integers" if allow_list else "an integer"
        raise wrapper.error("vision_feature_layer", f"must be {what}, got {value!r}")
    resolved = [k if k >= 0 else layers + 1 + k for k in picks]
    if any(not 1 <= k <= layers for k in resolved):
        raise wrapper.error(
            "vision_feature_layer", f"({value!r}) must pick block outputs 1..{layers} of the tower (or -1..-{layers})"
        )
    return max(resolved), len(picks)


def _unused_layers_note(tower: str, used: int, layers: int, key: str = "vision_feature_layer") -> list[str]:
    if used == layers:
        return []
    return [
        f"the {tower}'s last {layers - used} encoder layer(s) ({key}): run forward, their output unused, no backward"
    ]


def _siglip_head_note(f: ConfigFields) -> list[str]:
    if f.flag("vision_use_head"):
        return ["the SigLIP attention-pooling head (vision_use_head): run forward, its output unused"]
    return []


def _tower(
    f: ConfigFields, tower: str, layers: int, hidden: int, heads: int, *, gated: bool, **rest: Any
) -> VisionSpec:
    """A ViT tower: blocks with an ``intermediate_size``-wide MLP, on ``patch_size``² patches of
    ``num_channels``·p² inputs each unless ``patch_inputs`` says otherwise."""
    patch = f.integer("patch_size")
    if "patch_inputs" not in rest:
        rest["patch_inputs"] = f.integer("num_channels") * patch * patch
    return VisionSpec(
        tower=tower,
        layers=layers,
        hidden=hidden,
        heads=heads,
        ffn=f.integer("intermediate_size"),
        gated=gated,
        patch_size=patch,
        **rest,
    )


# -- the towers ---------------------------------------------------------------------------------


def read_qwen2_5_vl(cfg: Mapping[str, Any], text_hidden: int) -> tuple[VisionSpec, list[str]]:
    """Qwen2.5-VL: Conv3d patches (channels · temporal · p²), ``depth`` blocks (qkv, proj, gated
    MLP), full attention on ``fullatt_block_indexes`` and windows elsewhere, then the patch
    merger (two GEMMs per 2 x 2 merged token)."""
    f = _tower_fields(cfg, "qwen2_5_vl")
    layers = f.integer("depth", aliases=("num_hidden_layers",))
    heads = _heads(f, "num_heads", aliases=("num_attention_heads",))
    hidden = f.integer("hidden_size")
    patch = f.integer("patch_size")
    merge = f.integer("spatial_merge_size")
    full = f.raw("fullatt_block_indexes")
    if not isinstance(full, (list, tuple)) or any(isinstance(i, bool) or not isinstance(i, int) for i in full):
        raise f.error("fullatt_block_indexes", f"must be a list of block indexes, got {full!r}")
    windowed = tuple(int(i not in full) for i in range(layers))
    window = None
    if any(windowed):
        window = f.integer("window_size") // merge // patch
        if window < 1:
            raise f.error("window_size", f"({f.raw('window_size')}) is below one merged token ({merge} x {patch} px)")
    else:
        f.ignore("window_size")
    merged = hidden * merge * merge
    spec = _tower(
        f,
        "qwen2_5_vl",
        layers,
        hidden,
        heads,
        gated=True,
        patch_inputs=f.integer("in_channels") * f.integer("temporal_patch_size") * patch * patch,
        spatial_merge=merge,
        projector=((merged, merged), (merged, f.integer("out_hidden_size"))),
        window=window,
        windowed_layers=windowed if window is not None else None,
    )
    f.refuse_unread(VISION_COUNT_FIELDS)
    return spec, []


def read_gemma3(cfg: Mapping[str, Any], text_hidden: int) -> tuple[VisionSpec, list[str]]:
    """Gemma 3: SigLIP on fixed image_size² images (no class token), its last hidden state average-
    pooled to ``mm_tokens_per_image`` tokens and projected by one hidden x text-hidden matrix."""
    wrapper = ConfigFields(cfg, "gemma3", WRAPPER_DEFAULTS["gemma3"])
    f = _tower_fields(cfg, "gemma3")
    side = _grid_side(f)
    tokens = wrapper.integer("mm_tokens_per_image")
    per_side = int(tokens**0.5)
    if per_side * per_side != tokens or side % per_side:
        raise wrapper.error(
            "mm_tokens_per_image", f"({tokens}) must be a square whose side divides the {side} patches per side"
        )
    hidden = f.integer("hidden_size")
    spec = _tower(
        f,
        "siglip",
        f.integer("num_hidden_layers"),
        hidden,
        _heads(f),
        gated=False,
        spatial_merge=side // per_side,
        projector=((hidden, text_hidden),),
        image_grid=(side, side),
    )
    notes = _siglip_head_note(f)
    f.refuse_unread(VISION_COUNT_FIELDS)
    return spec, notes


def _shuffle_side(f: ConfigFields, side: int) -> int:
    ratio = f.raw("pixel_shuffle_ratio")
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise f.error("pixel_shuffle_ratio", f"must be a number in (0, 1], got {ratio!r}")
    merge = round(1 / ratio)
    if abs(merge * ratio - 1) > 1e-9 or side % merge:
        raise f.error("pixel_shuffle_ratio", f"({ratio}) must be 1/k with k dividing the {side} patches per side")
    return merge


def read_llama4(cfg: Mapping[str, Any], text_hidden: int) -> tuple[VisionSpec, list[str]]:
    """Llama 4: tiles of image_size² (Unfold + one linear patch embedding), a class token, the
    encoder (q/k/v/o, fc1/fc2), then per 2 x 2 pixel-shuffled token the adapter's fc1/fc2 and the
    multi-modal projector (as the modules are shaped: fc1 reads ``intermediate_size``)."""
    f = _tower_fields(cfg, "llama4")
    side = _grid_side(f)
    f.ignore("vision_feature_layer", "vision_feature_select_strategy")  # Llama4VisionModel reads neither
    spec = VisionSpec(
        tower="llama4",
        layers=f.integer("num_hidden_layers"),
        hidden=f.integer("hidden_size"),
        heads=_heads(f),
        ffn=f.integer("intermediate_size"),
        gated=False,
        patch_size=f.integer("patch_size"),
        patch_inputs=f.integer("num_channels") * f.integer("patch_size") ** 2,
        spatial_merge=_shuffle_side(f, side),
        projector=(
            (f.integer("intermediate_size"), f.integer("projector_input_dim")),
            (f.integer("projector_output_dim"), f.integer("projector_output_dim")),
            (f.integer("vision_output_dim"), text_hidden),
        ),
        class_tokens=1,
        image_grid=(side, side),
    )
    f.refuse_unread(VISION_COUNT_FIELDS)
    return spec, []


def read_mistral3(cfg: Mapping[str, Any], text_hidden: int) -> tuple[VisionSpec, list[str]]:
    """Mistral 3: Pixtral on variable-size images (block-diagonal attention per image, gated MLP),
    the ``vision_feature_layer`` state, then the projector's patch merger (h·m² → h per m x m
    block), linear_1 and linear_2."""
    wrapper = ConfigFields(cfg, "mistral3", WRAPPER_DEFAULTS["mistral3"])
    f = _tower_fields(cfg, "mistral3")
    layers = f.integer("num_hidden_layers")
    used, _ = _feature_layers(wrapper, layers, allow_list=False)
    hidden = f.integer("hidden_size")
    merge = wrapper.integer("spatial_merge_size")
    spec = _pixtral(
        f, used, merge, ((hidden * merge * merge, hidden), (hidden, text_hidden), (text_hidden, text_hidden))
    )
    f.refuse_unread(VISION_COUNT_FIELDS)
    return spec, _unused_layers_note("Pixtral tower", used, layers)


def _pixtral(f: ConfigFields, layers: int, merge: int, projector: tuple[tuple[int, int], ...]) -> VisionSpec:
    f.ignore("image_size")  # the largest size the processor makes; every image has its own
    heads, hidden = _heads(f), f.integer("hidden_size")
    # Not a PixtralVisionConfig field (its __post_init__ derives one); PixtralAttention takes hidden / heads.
    head_dim = f.optional_integer("head_dim") if f.has("head_dim") else None
    f.ignore("head_dim")
    if head_dim is not None and head_dim != hidden // heads:
        raise f.error(
            "head_dim",
            f"({head_dim}) must be hidden_size / num_attention_heads ({hidden // heads}), the width "
            "Pixtral's attention uses (its rotary embedding would take the other and fail)",
        )
    return _tower(
        f,
        "pixtral",
        layers,
        hidden,
        heads,
        gated=True,
        spatial_merge=merge,
        projector=projector,
    )


def read_llava(cfg: Mapping[str, Any], text_hidden: int) -> tuple[VisionSpec, list[str]]:
    """Llava: a CLIP (with a class token), SigLIP or Pixtral tower up to ``vision_feature_layer``
    (a list concatenates several), the class token dropped by the ``default`` strategy, then
    linear_1 and linear_2 per token."""
    wrapper = ConfigFields(cfg, "llava", WRAPPER_DEFAULTS["llava"])
    f = _tower_fields(cfg, "llava")
    tower_type = f.model_type
    layers = f.integer("num_hidden_layers")
    used, concatenated = _feature_layers(wrapper, layers, allow_list=True)
    strategy = wrapper.raw("vision_feature_select_strategy")
    if strategy not in ("default", "full"):
        raise wrapper.error("vision_feature_select_strategy", f"must be 'default' or 'full', got {strategy!r}")
    class_tokens = int(tower_type == "clip_vision_model")
    if strategy == "default" and not class_tokens:
        raise wrapper.error(
            "vision_feature_select_strategy",
            f"is 'default', which drops the first token, but a {tower_type} tower has no class token: "
            "it would drop an image patch, which packscope does not count; use 'full'",
        )
    hidden = f.integer("hidden_size")
    projector = ((hidden * concatenated, text_hidden), (text_hidden, text_hidden))
    if tower_type == "pixtral":
        spec = _pixtral(f, used, 1, projector)
        notes = _unused_layers_note("Pixtral tower", used, layers)
    else:
        side = _grid_side(f)
        spec = _tower(
            f,
            "clip" if class_tokens else "siglip",
            used,
            hidden,
            _heads(f),
            gated=False,
            projector=projector,
            class_tokens=class_tokens,
            projected_class_tokens=class_tokens if strategy == "full" else 0,
            image_grid=(side, side),
        )
        name = "CLIP tower" if class_tokens else "SigLIP tower"
        notes = _unused_layers_note(name, used, layers) + (_siglip_head_note(f) if not class_tokens else [])
    f.ignore("projection_dim")  # CLIPVisionModel has no projection (CLIPVisionModelWithProjection does)
    f.refuse_unread(VISION_COUNT_FIELDS)
    return spec, notes


READERS: dict[str, Callable[[Mapping[str, Any], int], tuple[VisionSpec, list[str]]]] = {
    "qwen2_5_vl": read_qwen2_5_vl,
    "gemma3": read_gemma3,
    "llama4": read_llama4,
    "mistral3": read_mistral3,
    "llava": read_llava,
}


def read_vision(cfg: Mapping[str, Any], mt: str, text_hidden: int) -> tuple[VisionSpec, list[str]]:
    """The tower of a multimodal config of model_type ``mt`` and what it runs but is not counted."""
    try:
        return READERS[mt](cfg, text_hidden)
    except ValueError as exc:  # a VisionSpec refusing the shapes
        if isinstance(exc, HFConfigError):
            raise
        raise HFConfigError(f"{mt} config.json: vision_config: {exc}") from None


__all__ = ["READERS", "TOWER_TYPES", "VISION_COUNT_FIELDS", "read_vision"]
