"""The towers of a vision-language wrapper transformers builds, read off their modules (docs/flops.md,
"The structural count", "Towers").

A wrapper (Qwen3-VL, Qwen3.5 with its vision tower, InternVL) is built by transformers on the meta
device, as the structural count builds a decoder; every child of the wrapper's inner model that
is not the decoder and holds GEMMs is a tower. A tower whose attention the count knows
(``GRID_TOWERS``: every block attends in full within each frame, the images described by
``image_grid_thw``; ``TILE_TOWERS``: fixed-size tiles with a class token; ``CROSS_TOWERS``: an
image's tiles attending together, read by the decoder's cross-attention layers) becomes a
:class:`VisionSpec` with its widths read off the modules, and the formula is then held to the
modules: each block's GEMMs are the formula's q, k, v, o and MLP, the projector is every GEMM of
the mergers (the deepstack ones included) or of the projector beside the tower, and nothing else
in the tower runs a GEMM. Any other tower is refused in one line naming its module class.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from packscope.agent.hf_audio import AUDIO_PROJECTORS, AUDIO_TOWERS
from packscope.core.hf_fields import HFConfigError
from packscope.core.vision import VisionSpec

# Tower classes whose attention is known: full in every block, each frame within itself
# (``get_vision_attention_seqlens`` with ``merge_temporal=False``), images from ``image_grid_thw``.
GRID_TOWERS = {
    "Qwen3VLVisionModel": "qwen3_vl",
    "Qwen3VLMoeVisionModel": "qwen3_vl",
    "Qwen3_5VisionModel": "qwen3_5",
    "Qwen3_5MoeVisionModel": "qwen3_5",
    "Qwen3OmniMoeVisionEncoder": "qwen3_vl",  # Qwen3-Omni's thinker: Qwen3-VL's tower, deepstack included
}
# Tower classes of fixed-size tiles (the count is pixel_values.shape[0]), each with a class token
# attending with the tile's patches, and the projector class the wrapper keeps beside each.
TILE_TOWERS = {"InternVLVisionModel": "internvl"}
# Tower classes that take pre-cut patches padded per image ([images, slots, patch values]), every
# slot attending to every other of its image, then pooled k x k (no GEMM) and projected per token.
ROW_TOWERS = {"Gemma4VisionModel": "gemma4"}
# Tower classes of fixed-size tiles, all tiles of an image attending together, whose tokens the
# decoder reads through cross-attention layers (mllama: ``mllama_tower``).
CROSS_TOWERS = {"MllamaVisionModel": "mllama"}
# Convolutional towers of a fixed input size, their work per image read off a run on the meta device
# (Gemma 3n: timm's MobileNet-V5 through transformers' TimmWrapperModel, ``mobilenet_tower``).
CONV_TOWERS = {"TimmWrapperModel": "mobilenetv5"}
PROJECTORS = {"InternVLMultiModalProjector": "InternVLVisionModel"}
# Projectors that share a class across towers, told apart by the wrapper's name for them.
NAMED_PROJECTORS = {
    "embed_vision": ("Gemma4VisionModel", "TimmWrapperModel"),
    "multi_modal_projector": ("MllamaVisionModel",),
}
# Names wrappers give their decoder (besides the module get_decoder() returns): never a tower.
_DECODER_NAMES = ("language_model", "text_model")


def _is_gemm(module: Any) -> bool:
    from torch import nn

    return isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))


def _is_linear(module: Any) -> bool:
    from torch import nn

    return isinstance(module, nn.Linear)


def _holds_gemms(module: Any) -> bool:
    return any(_is_gemm(m) for m in module.modules())


def _linear_macs(module: Any) -> int:
    from torch import nn

    return sum(m.in_features * m.out_features for m in module.modules() if isinstance(m, nn.Linear))


def towers(model: Any) -> dict[str, Any]:
    """The wrapper's towers by name: the children of its inner model, other than the decoder, that
    hold GEMMs (none for a decoder-only model)."""
    inner = getattr(model, "model", None)
    decoder = model.get_decoder()
    if inner is None or inner is decoder:
        return {}
    return {
        name: child
        for name, child in inner.named_children()
        if child is not decoder and name not in _DECODER_NAMES and _holds_gemms(child)
    }


def _refuse(mt: str, name: str, module: Any, why: str) -> HFConfigError:
    return HFConfigError(f"{mt}: the tower in '{name}' ({type(module).__name__}) is not counted: {why}")


def _patch_embedding(mt: str, name: str, tower: Any, conv: Any) -> tuple[int, int, int]:
    """(hidden, values one patch reads, patch side) of the patch convolution, a GEMM per patch."""
    from torch import nn

    if not isinstance(conv, (nn.Conv2d, nn.Conv3d)) or conv.stride != conv.kernel_size or conv.groups != 1:
        raise _refuse(mt, name, tower, "its patch embedding is not one non-overlapping convolution")
    if len(set(conv.kernel_size[-2:])) != 1:
        raise _refuse(mt, name, tower, f"its patches are not square ({conv.kernel_size})")
    return conv.out_channels, conv.weight[0].numel(), conv.kernel_size[-1]


def _block_widths(mt: str, name: str, tower: Any, attn: Any, mlp: Any, hidden: int) -> tuple[int, int, bool]:
    """(heads, MLP width, gated) of the first block, whose attention must span the hidden size."""
    from torch import nn

    if attn.num_heads * attn.head_dim != hidden:
        raise _refuse(mt, name, tower, f"its attention is {attn.num_heads} x {attn.head_dim} wide, not {hidden}")
    linears = [m for m in mlp.modules() if isinstance(m, nn.Linear)]
    if len(linears) not in (2, 3):
        raise _refuse(mt, name, tower, f"its MLP ({type(mlp).__name__}) is not two or three matrices")
    return attn.num_heads, linears[0].out_features, len(linears) == 3


def _gemm_pairs(mt: str, name: str, tower: Any, parts: list[Any], reads: int) -> tuple[tuple[int, int], ...]:
    """(in, out) of every GEMM of the projector ``parts``, each part reading ``reads`` values first."""
    pairs = []
    for part in parts:
        gemms = [m for m in part.modules() if _is_gemm(m)]
        if not all(_is_linear(m) for m in gemms) or not gemms or gemms[0].in_features != reads:
            raise _refuse(
                mt, name, tower, f"its projector {type(part).__name__} does not read {reads} values per token"
            )
        pairs += [(m.in_features, m.out_features) for m in gemms]
    return tuple(pairs)


def _checked(mt: str, name: str, tower: Any, spec: dict[str, Any], blocks: list[Any], parts: list[Any]) -> VisionSpec:
    """The VisionSpec, held to the modules: every block's GEMMs are the formula's q, k, v, o and MLP,
    and no GEMM of the tower lies outside the patch embedding, the blocks and the projector."""
    try:
        vision = VisionSpec(layers=len(blocks), **spec)
    except ValueError as exc:
        raise _refuse(mt, name, tower, str(exc)) from None
    for i, block in enumerate(blocks):
        if _linear_macs(block) != vision.block_macs or any(_is_gemm(m) and not _is_linear(m) for m in block.modules()):
            raise _refuse(mt, name, tower, f"block {i}'s GEMMs are not q, k, v, o and the MLP of the others")
    placed = {id(m) for part in (*blocks, *parts) for m in part.modules()}
    for sub, module in tower.named_modules():
        if _is_gemm(module) and id(module) not in placed:
            raise _refuse(mt, name, tower, f"its module '{sub}' ({type(module).__name__}) is not placed")
    return vision


def _mergers(mt: str, name: str, tower: Any) -> list[Any]:
    """The merger and the deepstack mergers that run (one per index within the blocks)."""
    indexes = list(getattr(tower, "deepstack_visual_indexes", None) or [])
    deepstack = list(getattr(tower, "deepstack_merger_list", None) or [])
    if len(set(indexes)) != len(indexes) or any(not 0 <= i < len(tower.blocks) for i in indexes):
        raise _refuse(mt, name, tower, f"deepstack_visual_indexes {indexes} are not distinct blocks of the tower")
    if len(deepstack) != len(indexes):
        raise _refuse(mt, name, tower, "its deepstack mergers do not match deepstack_visual_indexes")
    return [tower.merger, *deepstack]


def grid_tower(mt: str, name: str, tower: Any) -> VisionSpec:
    """The VisionSpec of a tower of ``GRID_TOWERS``, every GEMM of it placed and checked."""
    conv = tower.patch_embed.proj
    blocks = list(tower.blocks)
    merge = tower.spatial_merge_size
    spec = _tower_widths(mt, name, tower, conv, blocks[0].attn, blocks[0].mlp, merge)
    mergers = _mergers(mt, name, tower)
    spec["tower"] = GRID_TOWERS[type(tower).__name__]
    spec["projector"] = _gemm_pairs(mt, name, tower, mergers, spec["hidden"] * merge * merge)
    return _checked(mt, name, tower, spec, blocks, [conv, *mergers])


def _tower_widths(mt: str, name: str, tower: Any, conv: Any, attn: Any, mlp: Any, merge: int) -> dict[str, Any]:
    """The widths every tower kind's spec holds: its patch embedding's, its blocks' (read off the
    first block's attention and MLP) and its spatial merge."""
    hidden, patch_inputs, patch_size = _patch_embedding(mt, name, tower, conv)
    heads, ffn, gated = _block_widths(mt, name, tower, attn, mlp, hidden)
    return {
        "hidden": hidden,
        "heads": heads,
        "ffn": ffn,
        "gated": gated,
        "patch_size": patch_size,
        "patch_inputs": patch_inputs,
        "spatial_merge": merge,
    }


def tile_tower(mt: str, name: str, tower: Any, projector: Any, config: Any) -> VisionSpec:
    """InternVL's tower: fixed-size tiles of (image_size / patch)² patches and a class token, all
    attending to each other, the class token dropped (``vision_feature_select_strategy`` default),
    a pixel shuffle of 1 / ``downsample_ratio`` a side (no GEMM), then the projector per token."""
    if config.vision_feature_layer != -1:
        raise _refuse(mt, name, tower, f"vision_feature_layer {config.vision_feature_layer!r} is not read (only -1)")
    if config.vision_feature_select_strategy != "default":
        raise _refuse(mt, name, tower, "vision_feature_select_strategy 'full' keeps the class token: not read")
    merge = round(1 / config.downsample_ratio)
    if merge * config.downsample_ratio != 1:
        raise _refuse(mt, name, tower, f"downsample_ratio {config.downsample_ratio} is not 1/k")
    embeddings = tower.embeddings
    conv = embeddings.patch_embeddings.projection
    blocks = list(tower.encoder.layer)
    spec = _tower_widths(mt, name, tower, conv, blocks[0].attention, blocks[0].mlp, merge)
    spec["tower"] = TILE_TOWERS[type(tower).__name__]
    spec["projector"] = _gemm_pairs(mt, name, tower, [projector], spec["hidden"] * merge * merge)
    spec["class_tokens"] = 1 if getattr(embeddings, "cls_token", None) is not None else 0
    spec["image_grid"] = tuple(embeddings.patch_embeddings.patch_shape)
    return _checked(mt, name, tower, spec, blocks, [conv])


def row_tower(mt: str, name: str, tower: Any, projector: Any) -> VisionSpec:
    """Gemma 4's tower: each image's patches, pre-cut (3 · p² values each) and padded to the batch's
    slots, through ``patch_embedder.input_proj`` (one Linear), the encoder layers (q, k, v, o, gated
    MLP, every slot attending to every other of its image), an average pooling of k x k patches
    (``pooling_kernel_size``: a weighted sum, no GEMM), then ``embed_vision`` once per pooled token."""
    from torch import nn

    embed = tower.patch_embedder.input_proj
    if not isinstance(embed, nn.Linear):
        raise _refuse(mt, name, tower, "its patch embedding is not one Linear over pre-cut patches")
    blocks = list(tower.encoder.layers)
    attn, config = blocks[0].self_attn, tower.config
    hidden, heads = embed.out_features, config.num_attention_heads
    if heads * attn.head_dim != hidden or config.num_key_value_heads != heads:
        raise _refuse(
            mt,
            name,
            tower,
            f"its attention ({heads} heads, {config.num_key_value_heads} key/value heads of "
            f"{attn.head_dim}) is not q, k, v, o of {hidden} x {hidden}",
        )
    layout = SimpleNamespace(num_heads=heads, head_dim=attn.head_dim)  # kept in its config, not the module
    _, ffn, gated = _block_widths(mt, name, tower, layout, blocks[0].mlp, hidden)
    merge = config.pooling_kernel_size
    patch = config.patch_size
    if embed.in_features != 3 * patch * patch:
        raise _refuse(mt, name, tower, f"its patch embedding reads {embed.in_features} values, not 3 x {patch}²")
    spec = {
        "tower": ROW_TOWERS[type(tower).__name__],
        "hidden": hidden,
        "heads": heads,
        "ffn": ffn,
        "gated": gated,
        "patch_size": patch,
        "patch_inputs": embed.in_features,
        "spatial_merge": merge,
        "projector": _gemm_pairs(mt, name, tower, [projector], hidden),
    }
    return _checked(mt, name, tower, spec, blocks, [embed])


def _cross_layers(mt: str, model: Any) -> tuple[list[Any], dict[str, Any]]:
    """The decoder's cross-attention layers (those with a ``cross_attn``) and their widths, the same
    in each and held to the modules: q, k, v, o and the MLP are every GEMM of such a layer."""
    from torch import nn

    layers = [layer for layer in model.get_decoder().layers if hasattr(layer, "cross_attn")]
    if not layers:
        raise HFConfigError(f"{mt}: the decoder has no cross-attention layers (cross_attention_layers is empty)")
    widths = []
    for layer in layers:
        attn = layer.cross_attn
        q, k, v, o = (getattr(attn, n) for n in ("q_proj", "k_proj", "v_proj", "o_proj"))
        mlp = [m for m in layer.mlp.modules() if isinstance(m, nn.Linear)]
        placed = {id(m) for m in (q, k, v, o, *mlp)}
        stray = [n for n, m in layer.named_modules() if isinstance(m, (nn.Linear, nn.Conv1d)) and id(m) not in placed]
        hidden = q.in_features
        square = {(q.in_features, q.out_features), (o.out_features, o.in_features)} == {(hidden, q.out_features)}
        kv = {(k.in_features, k.out_features), (v.in_features, v.out_features)} == {(hidden, k.out_features)}
        if stray or not square or not kv or len(mlp) not in (2, 3):
            raise HFConfigError(f"{mt}: a cross-attention layer's GEMMs are not q, k, v, o and an MLP ({stray})")
        widths.append(
            {
                "cross_hidden": hidden,
                "cross_width": q.out_features,
                "cross_kv_width": k.out_features,
                "cross_ffn": mlp[0].out_features,
                "cross_gated": len(mlp) == 3,
                "macs": sum(m.in_features * m.out_features for m in mlp),
            }
        )
    if any(w != widths[0] for w in widths):
        raise HFConfigError(f"{mt}: its cross-attention layers differ in width")
    macs = widths[0].pop("macs")
    return layers, {"cross_layers": len(layers), **widths[0], "mlp_macs": macs}


def mllama_tower(mt: str, name: str, tower: Any, projector: Any, model: Any) -> tuple[VisionSpec, list[Any]]:
    """Llama 3.2 Vision's tower: each image's tiles (``max_num_tiles`` slots of (image_size / patch)²
    patches, a class token, padded to a multiple of 8) through the local encoder and then the gated
    global one, every tile slot of the image attending together; the projector (``vision_output_dim``:
    the last layer's and the ``intermediate_layers_indices`` layers' states side by side) per token;
    then k and v of every cross-attention layer per token, and q, o and the MLP of those layers per
    text token. (The spec, and the modules placed: the tower, the projector, the cross layers.)"""
    from torch import nn

    blocks = [*tower.transformer.layers, *tower.global_transformer.layers]
    conv = tower.patch_embedding
    spec = _tower_widths(mt, name, tower, conv, blocks[0].self_attn, blocks[0].mlp, 1)
    side = tower.image_size // tower.patch_size
    patches = side * side
    if tower.num_patches != patches + 1:
        raise _refuse(mt, name, tower, f"its tiles hold {tower.num_patches} tokens, not {patches} patches + 1")
    indices = list(tower.intermediate_layers_indices)
    if any(not 0 <= i < len(tower.transformer.layers) for i in indices):
        raise _refuse(mt, name, tower, f"intermediate_layers_indices {indices} are not layers of the local encoder")
    if not isinstance(projector, nn.Linear):
        raise _refuse(mt, name, tower, "its projector is not one Linear")
    spec["tower"] = CROSS_TOWERS[type(tower).__name__]
    spec["projector"] = _gemm_pairs(mt, name, tower, [projector], spec["hidden"] * (1 + len(indices)))
    spec["image_grid"] = (side, side)
    spec["class_tokens"] = -(-(patches + 1) // 8) * 8 - patches  # the class token and the padding to 8
    spec["projected_class_tokens"] = 1
    layers, cross = _cross_layers(mt, model)
    mlp_macs = cross.pop("mlp_macs")
    if cross["cross_hidden"] != projector.out_features:
        raise _refuse(mt, name, tower, "its cross-attention layers do not read the projector's tokens")
    vision = _checked(mt, name, tower, spec | cross, blocks, [conv])
    if vision.cross_mlp_macs != mlp_macs:
        raise HFConfigError(f"{mt}: a cross-attention layer's MLP is not {vision.cross_ffn} wide both ways")
    return vision, [tower, projector, *layers]


def vision_from_structure(model: Any, mt: str) -> tuple[VisionSpec | None, list[Any]]:
    """(the vision tower's spec or None, the tower modules placed) of a built model; a tower that
    cannot be counted is refused in one line naming its class (all of them, if several)."""
    found = towers(model)
    classes = {type(t).__name__ for t in found.values()}
    known = set(GRID_TOWERS) | set(TILE_TOWERS) | set(ROW_TOWERS) | set(CROSS_TOWERS) | set(CONV_TOWERS)
    known |= {p for p, t in PROJECTORS.items() if t in classes}
    known |= set(AUDIO_TOWERS)  # counted apart (packscope.agent.hf_audio), with their projectors
    projectors = {n for n, t in NAMED_PROJECTORS.items() if n in found and classes & set(t)}
    projectors |= {n for t, n in AUDIO_PROJECTORS.items() if n in found and t in classes}
    refused = [
        f"'{name}' ({type(t).__name__})"
        for name, t in found.items()
        if type(t).__name__ not in known and name not in projectors
    ]
    if refused:
        raise HFConfigError(
            f"{mt}: the tower{'s' if len(refused) > 1 else ''} in {', '.join(refused)} "
            f"{'are' if len(refused) > 1 else 'is'} not counted yet; count the decoder by giving its text_config "
            "alone (with the text model_type)"
        )
    towers_only = {
        n: t for n, t in found.items() if type(t).__name__ not in (*PROJECTORS, *AUDIO_TOWERS) and n not in projectors
    }
    if len(towers_only) > 1:
        raise HFConfigError(f"{mt}: {len(towers_only)} vision towers ({', '.join(towers_only)}); packscope counts one")
    if not towers_only:
        return None, []
    ((name, tower),) = towers_only.items()
    if type(tower).__name__ in GRID_TOWERS:
        return grid_tower(mt, name, tower), [tower]
    if type(tower).__name__ in (*ROW_TOWERS, *CROSS_TOWERS, *CONV_TOWERS):
        (projector,) = (found[n] for n in projectors if type(tower).__name__ in NAMED_PROJECTORS.get(n, ()))
        if type(tower).__name__ in CONV_TOWERS:
            return mobilenet_tower(mt, name, tower, projector, model.config), [tower, projector]
        if type(tower).__name__ in CROSS_TOWERS:
            return mllama_tower(mt, name, tower, projector, model)
        return row_tower(mt, name, tower, projector), [tower, projector]
    (projector,) = (t for t in found.values() if PROJECTORS.get(type(t).__name__) == type(tower).__name__)
    return tile_tower(mt, name, tower, projector, model.config), [tower, projector]


# Module classes of timm's MobileNet-V5 encoder (Gemma 3n's tower) whose work the reader prices or
# that do no GEMM: any other class in the tower is refused by name (its work would go uncounted).
MOBILENET_CLASSES = frozenset(
    {
        "TimmWrapperModel",
        "MobileNetV5Encoder",
        "MobileNetV5MultiScaleFusionAdapter",
        "UniversalInvertedResidual",
        "EdgeResidual",
        "MobileAttention",
        "MultiQueryAttention2d",
        "ConvNormAct",
        "Conv2d",
        "Conv2dSame",
        "RmsNorm2d",
        "RmsNormAct2d",
        "LayerScale2d",
        "Sequential",
        "Identity",
        "Dropout",
        "DropPath",
        "GELU",
        "AvgPool2d",
        "Upsample",
    }
)


def _conv_macs(conv: Any, output: Any) -> int:
    """Multiply-adds of a convolution that gave ``output`` for one image: every output value reads
    in_channels / groups x the kernel's area."""
    kh, kw = conv.kernel_size
    return int(output[0].numel()) * (conv.in_channels // conv.groups) * kh * kw


def mobilenet_tower(mt: str, name: str, tower: Any, projector: Any, config: Any) -> VisionSpec:
    """Gemma 3n's tower: timm's MobileNet-V5 encoder (``TimmWrapperModel``) at the input size its timm
    config fixes (768², ``pretrained_cfg["input_size"]``), run once on the meta device with hooks:
    every convolution's output shape gives its multiply-adds, and each multi-query attention block's
    query and downsampled key shapes its QKᵀ and P·V (heads x queries x keys x (key + value width));
    its output grid (16 x 16, ``vision_soft_tokens_per_image``) is the soft tokens that
    ``embed_vision`` projects, once each. The work of an image is fixed: it is priced per image."""
    import torch
    from torch import nn

    encoder: Any = getattr(tower, "timm_model", None)
    if type(encoder).__name__ != "MobileNetV5Encoder":
        raise _refuse(mt, name, tower, f"its timm model is {type(encoder).__name__}, not a MobileNet-V5 encoder")
    unknown = sorted({type(m).__name__ for m in tower.modules()} - MOBILENET_CLASSES)
    if unknown:
        raise _refuse(mt, name, tower, f"its modules {', '.join(unknown)} are not priced")
    channels, height, width = encoder.pretrained_cfg["input_size"]
    macs = dict.fromkeys(("conv", "attention", "core_full", "fusion"), 0)
    shapes: dict[int, dict[str, Any]] = {}
    fusion = {id(m) for m in encoder.msfa.modules()}
    attentions = [m for m in encoder.modules() if type(m).__name__ == "MultiQueryAttention2d"]
    in_attention = {id(m) for a in attentions for m in a.modules()}

    def conv_hook(module: Any, args: Any, output: Any) -> None:
        part = "fusion" if id(module) in fusion else "attention" if id(module) in in_attention else "conv"
        macs[part] += _conv_macs(module, output)

    def shape_hook(attn: Any, which: str) -> Any:
        return lambda module, args, output: shapes.setdefault(id(attn), {}).__setitem__(which, output.shape)

    handles = []
    for module in encoder.modules():
        if isinstance(module, nn.Conv2d):
            handles.append(module.register_forward_hook(conv_hook))
    for attn in attentions:
        handles.append(attn.query.register_forward_hook(shape_hook(attn, "query")))
        handles.append(attn.key.register_forward_hook(shape_hook(attn, "key")))
    try:
        with torch.no_grad():
            out = tower(pixel_values=torch.empty(1, channels, height, width, device="meta"), do_pooling=False)
    finally:
        for handle in handles:
            handle.remove()
    for attn in attentions:
        seen = shapes.get(id(attn), {})
        if set(seen) != {"query", "key"} or seen["key"][1] != attn.key_dim:
            raise _refuse(mt, name, tower, "an attention block's keys are not one head of key_dim")
        queries = seen["query"][2] * seen["query"][3]
        keys = seen["key"][2] * seen["key"][3]
        macs["core_full"] += attn.num_heads * queries * keys * (attn.key_dim + attn.value_dim)
    features = out.last_hidden_state
    _, hidden, grid_h, grid_w = features.shape
    soft = getattr(config, "vision_soft_tokens_per_image", None)
    if soft != grid_h * grid_w:
        raise _refuse(mt, name, tower, f"its {grid_h} x {grid_w} output is not vision_soft_tokens_per_image ({soft})")
    if height != width or height % grid_h or width % grid_w or height // grid_h != width // grid_w:
        raise _refuse(mt, name, tower, f"its {height} x {width} input is not square cells of its {grid_h} x {grid_w}")
    gemms = [m for m in projector.modules() if _is_gemm(m)]
    if gemms != [projector.embedding_projection] or projector.embedding_projection.in_features != hidden:
        raise _refuse(mt, name, tower, f"its embed_vision is not one projection of the {hidden}-wide tokens")
    side = height // grid_h
    heads = {a.num_heads for a in attentions}
    try:
        return VisionSpec(
            tower="mobilenetv5",
            layers=sum(len(stage) for stage in encoder.blocks),  # shown: the blocks of every stage
            hidden=hidden,
            heads=max(heads) if heads else 1,  # shown, as ffn (the fusion adapter's width): image_macs prices
            ffn=encoder.msfa.ffn.pw_exp.conv.out_channels,
            gated=False,
            patch_size=side,
            patch_inputs=channels * side * side,
            projector=_gemm_pairs(mt, name, tower, [projector], hidden),
            image_grid=(grid_h, grid_w),
            image_macs=tuple(macs.items()),
        )
    except ValueError as exc:
        raise _refuse(mt, name, tower, str(exc)) from None


__all__ = [
    "CONV_TOWERS",
    "CROSS_TOWERS",
    "GRID_TOWERS",
    "NAMED_PROJECTORS",
    "PROJECTORS",
    "ROW_TOWERS",
    "TILE_TOWERS",
    "grid_tower",
    "mllama_tower",
    "mobilenet_tower",
    "row_tower",
    "tile_tower",
    "towers",
    "vision_from_structure",
]
