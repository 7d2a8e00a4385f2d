"""The independent check's instruments for vision towers: what transformers' own towers compute.

Nothing here uses packscope's formula. ``run_tower`` passes images through a model's own image
path (``get_image_features``, and Llama 4's projector as its forward applies it), with hooks that

* count the multiply-adds every nn.Linear and convolution executed, from its weight's shape and
  the tokens it saw (and Gemma 3's projection matrix, a Parameter used in ``torch.matmul``),
  split by where the module sits (patch embedding, an encoder block's attention or MLP, the
  projector);
* count, for every attention call, the (query, key) pairs it computes: the mask's allowed entries
  where the tower passes one (Pixtral's block-diagonal mask), else every pair of the call (the
  tower's own split of the sequence: Qwen2.5-VL's cu_seqlens and window index, one image per
  batch row elsewhere), and the head widths of the query and value tensors;
* on the CPU, run a backward pass from the image features and mark each GEMM whose output received
  a gradient: only those are model work (a layer after Llava's feature layer runs forward only).

On the meta device (the published configs at full size) shapes propagate, forward and backward,
without any arithmetic; a mask there has no values, so the pairs of a masked call (Pixtral's) are
counted from the tower's own mask function on the CPU instead (``block_mask_pairs``).
"""

from __future__ import annotations

import re
import warnings
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

warnings.filterwarnings("ignore", module="transformers")

from transformers.masking_utils import AttentionMaskInterface, sdpa_mask  # noqa: E402
from transformers.modeling_utils import AttentionInterface  # noqa: E402

COUNT = "packscope_vision_count"
COMPONENTS = ("patch_embedding", "attention", "mlp", "projector")
_BLOCK = re.compile(r"\.(?:blocks|layers|layer)\.(\d+)\.")  # InternViT: encoder.layer.N


@dataclass
class Tally:
    """What one pass through a tower did."""

    macs: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # component -> MACs with a gradient
    forward_only_macs: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # ran, got no gradient
    block_macs: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # encoder block -> GEMM MACs
    pairs: dict[int, int] = field(default_factory=lambda: defaultdict(int))  # encoder block -> attention pairs
    pair_macs: dict[int, set[int]] = field(default_factory=lambda: defaultdict(set))  # block -> MACs per pair
    backward_blocks: set[int] = field(default_factory=set)  # blocks whose attention output got a gradient
    ran_backward: bool = False
    unread_masks: set[int] = field(default_factory=set)  # blocks whose mask lives on the meta device


_ACTIVE: list[Tally] = []
_MODULE_BLOCK: dict[int, int] = {}  # id(attention module) -> block index


def _component(name: str) -> str | None:
    """Where a module sits, from its qualified name in the model."""
    if any(part in name for part in ("merger", "multi_modal_projector", "vision_adapter", "embed_vision")):
        return "projector"
    if "patch_embed" in name or "patch_conv" in name:
        return "patch_embedding"
    if _BLOCK.search(name + "."):
        if re.search(r"\.(attn|self_attn|attention)\.", name + "."):
            return "attention"
        if re.search(r"\.(mlp|feed_forward)\.", name + "."):
            return "mlp"
    return None


def _executed_macs(module: nn.Module, output: torch.Tensor) -> int:
    if isinstance(module, nn.Linear):
        return output.numel() // module.out_features * module.in_features * module.out_features
    if isinstance(module, (nn.Conv2d, nn.Conv3d)):
        per_output = module.in_channels // module.groups
        for k in module.kernel_size:
            per_output *= k
        return output.numel() * per_output
    weight = module.mm_input_projection_weight  # Gemma 3's projector: matmul with a [vision, text] matrix
    return output.numel() // weight.shape[1] * weight.numel()


def _gemm_hook(name: str, component: str, block: int | None):
    def hook(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        if not _ACTIVE:
            return
        tally = _ACTIVE[-1]
        macs = _executed_macs(module, output)
        if block is not None:
            tally.block_macs[block] += macs
        if output.requires_grad:
            tally.forward_only_macs[component] += macs  # until its gradient arrives

            def got_gradient(grad: torch.Tensor) -> None:
                tally.forward_only_macs[component] -= macs
                tally.macs[component] += macs

            output.register_hook(got_gradient)
        else:
            tally.macs[component] += macs  # no backward pass: every GEMM that ran

    return hook


def _attention_output_hook(block: int):
    def hook(module: nn.Module, args: Any, output: Any) -> None:
        out = output[0] if isinstance(output, tuple) else output
        if _ACTIVE and out.requires_grad:
            tally = _ACTIVE[-1]
            out.register_hook(lambda grad: tally.backward_blocks.add(block))

    return hook


def instrument(model: nn.Module) -> None:
    """Hook every GEMM of the vision path and every attention module of the tower, once."""
    if getattr(model, "_packscope_instrumented", False):
        return
    for name, module in model.named_modules():
        if "language_model" in name or name.startswith("lm_head"):
            continue
        match = _BLOCK.search(name + ".")
        block = int(match.group(1)) if match else None
        gemm = isinstance(module, (nn.Linear, nn.Conv2d, nn.Conv3d)) or hasattr(module, "mm_input_projection_weight")
        component = _component(name)
        if gemm and component is not None:
            module.register_forward_hook(_gemm_hook(name, component, block))
        if block is not None and re.fullmatch(r".*\.(?:blocks|layers|layer)\.\d+\.(attn|self_attn|attention)", name):
            _MODULE_BLOCK[id(module)] = block
            module.register_forward_hook(_attention_output_hook(block))
    model._packscope_instrumented = True


def _allowed_pairs(query: torch.Tensor, key: torch.Tensor, mask: torch.Tensor | None) -> int:
    rows, q_len, k_len = query.shape[0], query.shape[-2], key.shape[-2]
    if mask is None:
        return rows * q_len * k_len
    mask = mask[..., :q_len, :k_len]
    allowed = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    return int(allowed.expand(rows, 1, q_len, k_len).sum())


def counting_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Count the pairs of this call, then attend (bidirectionally, with the tower's mask) by SDPA."""
    if _ACTIVE:
        tally = _ACTIVE[-1]
        block = _MODULE_BLOCK[id(module)]
        if attention_mask is not None and attention_mask.device.type == "meta":
            tally.unread_masks.add(block)  # a mask without values: its pairs are counted by the caller
        else:
            tally.pairs[block] += _allowed_pairs(query, key, attention_mask)
        tally.pair_macs[block].add(query.shape[1] * query.shape[-1] + value.shape[1] * value.shape[-1])
    return attend(query, key, value, attention_mask, scaling), None


def attend(query, key, value, attention_mask, scaling=None) -> torch.Tensor:
    """What an eager attention returns, by SDPA with transformers' additive mask read as allowed
    pairs: (batch, length, heads, head dim)."""
    mask = attention_mask
    if mask is not None and mask.dtype != torch.bool:
        mask = mask > torch.finfo(mask.dtype).min / 2
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, attn_mask=mask, scale=scaling)
    return out.transpose(1, 2).contiguous()


AttentionInterface.register(COUNT, counting_attention)
# The masks the counting attention receives are SDPA's (a tower built with create_bidirectional_mask,
# Gemma 4's, masks its padding slots as keys): without one registered, transformers builds none.
AttentionMaskInterface.register(COUNT, sdpa_mask)


def use_counting_attention(config: Any) -> None:
    config.vision_config._attn_implementation = COUNT


def _flat(pooled: Any) -> torch.Tensor:
    """The decoder tokens as rows, whether given per image (a list) or per tile (InternVL: 3-D)."""
    parts = pooled if isinstance(pooled, (list, tuple)) else [pooled]
    return torch.cat([p.reshape(-1, p.shape[-1]) for p in parts])


def image_outputs(model: nn.Module, tower: str, inputs: dict[str, Any]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The tokens the tower hands to the decoder, through the model's own image path, and what else
    the decoder takes from it (Qwen3-VL's deepstack features, added to its first layers' states)."""
    if tower == "llama4" or (tower == "pixtral" and inputs["pixel_values"].device.type == "meta"):
        return image_features(model, tower, inputs), []
    out = getattr(model, "model", model).get_image_features(**inputs)
    return _flat(out.pooler_output), [_flat(f) for f in getattr(out, "deepstack_features", None) or []]


def image_features(model: nn.Module, tower: str, inputs: dict[str, Any]) -> torch.Tensor:
    """The tokens the tower hands to the decoder, through the model's own image path."""
    inner = getattr(model, "model", model)  # Llama 4's wrapper holds its parts itself
    if tower == "llama4":
        out = inner.get_image_features(inputs["pixel_values"])
        if out.pooler_output is None:  # transformers < 5.25: its forward applied the projector after
            feats = out.last_hidden_state
            return inner.multi_modal_projector(feats.view(-1, feats.size(-1)))
        return out.pooler_output.reshape(-1, out.pooler_output.shape[-1])  # projected inside, as the others
    if tower == "pixtral" and inputs["pixel_values"].device.type == "meta":
        return _mistral3_features_on_meta(inner, inputs)
    return image_outputs(model, tower, inputs)[0]


def _mistral3_features_on_meta(inner: nn.Module, inputs: dict[str, Any]) -> torch.Tensor:
    """Mistral3Model.get_image_features up to its projector, as written there; its last step (the
    split per image) reads sizes back with .tolist(), which a meta tensor cannot do."""
    layer = inner.config.vision_feature_layer
    out = inner.vision_tower(inputs["pixel_values"], image_sizes=inputs["image_sizes"], output_hidden_states=True)
    return inner.multi_modal_projector(out.hidden_states[layer].squeeze(0), inputs["image_sizes"])


def run_tower(model: nn.Module, tower: str, inputs: dict[str, Any], backward: bool) -> tuple[Tally, torch.Tensor]:
    """One pass of ``inputs`` (the processor's tensors) through the image path, counted."""
    instrument(model)
    tally = Tally()
    _ACTIVE.append(tally)
    try:
        with torch.set_grad_enabled(backward):
            feats, extra = image_outputs(model, tower, inputs)
            if backward:  # from every output the decoder takes: each one's GEMMs get a gradient
                sum((f.float().sum() for f in extra), feats.float().sum()).backward()
                tally.ran_backward = True
    finally:
        _ACTIVE.pop()
    return tally, feats


def block_mask_pairs(patches_per_image: list[int]) -> int:
    """Pairs Pixtral's own block-diagonal mask (``generate_block_attention_mask``) allows for images
    of these patch counts, built on the CPU."""
    from transformers.models.pixtral.modeling_pixtral import generate_block_attention_mask

    total = sum(patches_per_image)
    mask = generate_block_attention_mask(patches_per_image, torch.empty(1, total, 1, dtype=torch.bfloat16))
    return int((mask == 0).sum())


def measured_flops(tally: Tally, windowed_blocks: set[int]) -> dict[str, int]:
    """The tally as FLOPs (6 per multiply-add): GEMMs by component, and QKᵀ + P·V of the full and
    the windowed blocks (``windowed_blocks``: the tower's own choice, e.g. Qwen2.5-VL's blocks
    not in ``fullatt_block_indexes``)."""
    out = {key: 6 * tally.macs.get(key, 0) for key in COMPONENTS}
    core = {"core_full": 0, "core_window": 0}
    for block, pairs in tally.pairs.items():
        if tally.ran_backward and block not in tally.backward_blocks:
            continue  # ran forward only: its output fed nothing
        (per_pair,) = tally.pair_macs[block]
        core["core_window" if block in windowed_blocks else "core_full"] += 6 * pairs * per_pair
    return {**out, **core}
