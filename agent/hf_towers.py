"""The towers of a vision-language wrapper transformers builds, read off their modules (docs/flops.md,
"The structural count", "Towers").

A wrapper (Qwen3-VL, Qwen3.5 with its vision tower, ...) is built by transformers on the meta
device, as the structural count builds a decoder; every child of the wrapper's inner model that
is not the decoder and holds GEMMs is a tower. A tower whose attention the count knows (the table
``GRID_TOWERS``: every block attends in full within each frame, the images described by
``image_grid_thw``) becomes a :class:`VisionSpec` with its widths read off the modules, and the
formula is then held to the modules: each block's GEMMs are the formula's q, k, v, o and MLP, the
projector is every GEMM of the merger and of the deepstack mergers, and nothing else in the tower
runs a GEMM. Any other tower is refused in one line naming its module class.
"""

from __future__ import annotations

from typing import Any

from packscope.core.hf_fields import HFConfigError
from packscope.core.vision import VisionSpec

# Tower classes whose attention is known: full in every block, each frame within itself
# (``get_vision_attention_seqlens`` with ``merge_temporal=False``), images from ``image_grid_thw``.
GRID_TOWERS = {
    "Qwen3VLVisionModel": "qwen3_vl",
    "Qwen3VLMoeVisionModel": "qwen3_vl",
    "Qwen3_5VisionModel": "qwen3_5",
    "Qwen3_5MoeVisionModel": "qwen3_5",
}
# Children of a wrapper's inner model that feed a tower's output to the decoder but are no tower.
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


def _patch_embedding(mt: str, name: str, tower: Any) -> tuple[int, int, int]:
    """(hidden, values one patch reads, patch side) of the patch convolution, a GEMM per patch."""
    from torch import nn

    conv = getattr(getattr(tower, "patch_embed", None), "proj", None)
    if not isinstance(conv, (nn.Conv2d, nn.Conv3d)) or conv.stride != conv.kernel_size or conv.groups != 1:
        raise _refuse(mt, name, tower, "its patch embedding is not one non-overlapping convolution")
    return conv.out_channels, conv.weight[0].numel(), conv.kernel_size[-1]


def _block_widths(mt: str, name: str, tower: Any, hidden: int) -> tuple[int, int, bool]:
    """(heads, MLP width, gated) of the first block, whose attention must span the hidden size."""
    from torch import nn

    block = tower.blocks[0]
    attn, mlp = block.attn, block.mlp
    if attn.num_heads * attn.head_dim != hidden:
        raise _refuse(mt, name, tower, f"its attention is {attn.num_heads} x {attn.head_dim} wide, not {hidden}")
    linears = [m for m in mlp.modules() if isinstance(m, nn.Linear)]
    if len(linears) not in (2, 3):
        raise _refuse(mt, name, tower, f"its MLP ({type(mlp).__name__}) is not two or three matrices")
    return attn.num_heads, linears[0].out_features, len(linears) == 3


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
    hidden, patch_inputs, patch_size = _patch_embedding(mt, name, tower)
    heads, ffn, gated = _block_widths(mt, name, tower, hidden)
    merge = tower.spatial_merge_size
    mergers = _mergers(mt, name, tower)
    projector = [(m.in_features, m.out_features) for merger in mergers for m in merger.modules() if _is_gemm(m)]
    for merger in mergers:  # each reads the merge x merge patches of one decoder token
        first = next(m for m in merger.modules() if _is_gemm(m))
        if first.in_features != hidden * merge * merge:
            raise _refuse(mt, name, tower, f"a merger reads {first.in_features} values, not {merge}² patches")
    try:
        spec = VisionSpec(
            tower=GRID_TOWERS[type(tower).__name__],
            layers=len(tower.blocks),
            hidden=hidden,
            heads=heads,
            ffn=ffn,
            gated=gated,
            patch_size=patch_size,
            patch_inputs=patch_inputs,
            spatial_merge=merge,
            projector=tuple(projector),
        )
    except ValueError as exc:
        raise _refuse(mt, name, tower, str(exc)) from None
    for i, block in enumerate(tower.blocks):  # the formula's q, k, v, o and MLP, block by block
        if _linear_macs(block) != spec.block_macs or any(_is_gemm(m) and not _is_linear(m) for m in block.modules()):
            raise _refuse(mt, name, tower, f"block {i}'s GEMMs are not q, k, v, o and the MLP of the others")
    placed = {id(m) for part in (tower.patch_embed, *tower.blocks, *mergers) for m in part.modules()}
    for sub, module in tower.named_modules():
        if _is_gemm(module) and id(module) not in placed:
            raise _refuse(mt, name, tower, f"its module '{sub}' ({type(module).__name__}) is not placed")
    return spec


def vision_from_structure(model: Any, mt: str) -> tuple[VisionSpec | None, list[Any]]:
    """(the vision tower's spec or None, the tower modules placed) of a built model; a tower that
    cannot be counted is refused in one line naming its class (all of them, if several)."""
    found = towers(model)
    refused = [f"'{name}' ({type(t).__name__})" for name, t in found.items() if type(t).__name__ not in GRID_TOWERS]
    if refused:
        raise HFConfigError(
            f"{mt}: the tower{'s' if len(refused) > 1 else ''} in {', '.join(refused)} "
            f"{'are' if len(refused) > 1 else 'is'} not counted yet; count the decoder by giving its text_config "
            "alone (with the text model_type)"
        )
    if len(found) > 1:
        raise HFConfigError(f"{mt}: {len(found)} vision towers ({', '.join(found)}); packscope counts one")
    if not found:
        return None, []
    ((name, tower),) = found.items()
    return grid_tower(mt, name, tower), [tower]


__all__ = ["GRID_TOWERS", "grid_tower", "towers", "vision_from_structure"]
