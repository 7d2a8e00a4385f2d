"""The independent check's instruments for audio towers: what transformers' own audio tower computes.

Nothing here uses packscope's formula. ``run_audio`` passes clips through the model's own audio path
(``get_audio_features`` with a ``feature_attention_mask``), with hooks that count the multiply-adds
every nn.Linear and nn.Conv2d of the tower executed, from its weight's shape and the output it
produced (padding included: what ran), split by where the module sits; an attention function that
counts the (query, key) pairs of every call the tower makes (its own split into windows) and the
head widths of the query and value tensors; and a backward pass from the features, counting only
the GEMMs whose output received a gradient.
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

from transformers.modeling_utils import AttentionInterface  # noqa: E402

COUNT = "packscope_audio_count"
COMPONENTS = ("conv", "attention", "mlp", "projector")


@dataclass
class Tally:
    macs: dict[str, int] = field(default_factory=lambda: defaultdict(int))  # component -> MACs with a gradient
    forward_only_macs: dict[str, int] = field(default_factory=lambda: defaultdict(int))
    pairs: int = 0
    pair_flops: int = 0  # 6 · pairs · (query width + value width), over every call
    calls: list[tuple[int, int]] = field(default_factory=list)  # (query, key) lengths of each call


_ACTIVE: list[Tally] = []


def _component(name: str) -> str:
    """Where a GEMM of the audio tower sits, from its name; anything else fails the check."""
    if re.fullmatch(r"conv2d\d|conv_out", name):
        return "conv"
    if re.fullmatch(r"layers\.\d+\.self_attn\.\w+", name):
        return "attention"
    if re.fullmatch(r"layers\.\d+\.fc[12]", name):
        return "mlp"
    if re.fullmatch(r"proj[12]", name):
        return "projector"
    raise AssertionError(f"a GEMM of the audio tower at {name!r} that the check does not place")


def _executed_macs(module: nn.Module, output: torch.Tensor) -> int:
    if isinstance(module, nn.Linear):
        return output.numel() // module.out_features * module.in_features * module.out_features
    assert isinstance(module, nn.Conv2d)
    k = module.kernel_size[0] * module.kernel_size[1]
    return output.numel() * module.in_channels // module.groups * k


def _hook(component: str):
    def hook(module: nn.Module, args: Any, output: torch.Tensor) -> None:
        if not _ACTIVE:
            return
        tally, macs = _ACTIVE[-1], _executed_macs(module, output)
        if output.requires_grad:
            tally.forward_only_macs[component] += macs

            def got_gradient(grad: torch.Tensor) -> None:
                tally.forward_only_macs[component] -= macs
                tally.macs[component] += macs

            output.register_hook(got_gradient)
        else:
            tally.macs[component] += macs

    return hook


def counting_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Count the pairs of this call (every one: the tower's attention is bidirectional, unmasked)."""
    assert attention_mask is None
    if _ACTIVE:
        tally = _ACTIVE[-1]
        pairs = query.shape[0] * query.shape[-2] * key.shape[-2]
        tally.pairs += pairs
        tally.pair_flops += 6 * pairs * (query.shape[1] * query.shape[-1] + value.shape[1] * value.shape[-1])
        tally.calls.append((query.shape[-2], key.shape[-2]))
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, scale=scaling)
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(COUNT, counting_attention)


def instrument(tower: nn.Module) -> None:
    if getattr(tower, "_packscope_audio_instrumented", False):
        return
    for name, module in tower.named_modules():
        if isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d)):
            module.register_forward_hook(_hook(_component(name)))
    tower._packscope_audio_instrumented = True


def clip_inputs(frames: list[int], mel_bins: int) -> dict[str, torch.Tensor]:
    """What the feature extractor hands the model: clips padded to the longest, and the mask."""
    longest = max(frames)
    mask = torch.zeros(len(frames), longest, dtype=torch.long)
    for i, n in enumerate(frames):
        mask[i, :n] = 1
    return {"input_features": torch.randn(len(frames), mel_bins, longest), "feature_attention_mask": mask}


def run_audio(model: nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[Tally, torch.Tensor]:
    """One pass of the clips through the model's audio path, forward and backward, counted."""
    inner = getattr(model, "model", model)
    inner.audio_tower.config._attn_implementation = COUNT
    instrument(inner.audio_tower)
    tally = Tally()
    _ACTIVE.append(tally)
    try:
        feats = inner.get_audio_features(**inputs).last_hidden_state
        feats.float().sum().backward()
    finally:
        _ACTIVE.pop()
    return tally, feats


def measured_flops(tally: Tally) -> dict[str, int]:
    """The tally as FLOPs: 6 per multiply-add of each GEMM that got a gradient, and QKᵀ + P·V."""
    return {**{key: 6 * tally.macs.get(key, 0) for key in COMPONENTS}, "core_full": tally.pair_flops}
