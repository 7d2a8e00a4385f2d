"""The independent check's instruments for Gemma 4's audio tower: what transformers' own tower computes.

Nothing here uses packscope's formula. ``run_audio`` passes clips through the wrapper's own audio
path (``get_audio_features``: ``Gemma4AudioModel`` then ``embed_audio``) under torch's
``FlopCounterMode``, which counts the FLOPs of every matmul and convolution that ran, shapes as
executed (padding included), by the module they ran in. The components are read from the module
names: the GEMM modules where they sit, and the attention's own matmuls (QKᵀ, the position logits,
P·V) as what its module ran beyond its projections. The backward pass from the embedded features
is counted too, and hooks record which GEMM outputs received a gradient.
"""

from __future__ import annotations

import re
import warnings
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

warnings.filterwarnings("ignore", module="transformers")

TOWER, EMBED = "Gemma4AudioModel", "Gemma4MultimodalEmbedder"


@dataclass
class Tally:
    forward: dict[str, dict[Any, int]]  # FlopCounterMode's counts: module name -> {op: FLOPs}
    backward: dict[Any, int] = field(default_factory=dict)  # {op: FLOPs} of the backward pass
    gemms: set[str] = field(default_factory=set)  # the GEMM modules that ran
    got_gradient: set[str] = field(default_factory=set)  # ... whose output received a gradient


def _component(name: str) -> str:
    """Where a GEMM module of the tower or of embed_audio sits, from its name; else the check fails."""
    if name.startswith(f"{TOWER}.subsample_conv_projection."):
        return "conv"
    if re.fullmatch(rf"{TOWER}\.layers\.\d+\.self_attn\.((q_proj|k_proj|v_proj|post)\.linear|relative_k_proj)", name):
        return "attention"
    if re.fullmatch(rf"{TOWER}\.layers\.\d+\.lconv1d\.\w+(\.linear)?", name):
        return "lconv"
    if re.fullmatch(rf"{TOWER}\.layers\.\d+\.feed_forward[12]\.ffw_layer_[12]\.linear", name):
        return "mlp"
    if name in (f"{TOWER}.output_proj", f"{EMBED}.embedding_projection"):
        return "projector"
    raise AssertionError(f"a GEMM at {name!r} that the check does not place")


def _gemm_names(model: nn.Module) -> dict[str, nn.Module]:
    inner = getattr(model, "model", model)
    out = {}
    for root, module in ((TOWER, inner.audio_tower), (EMBED, inner.embed_audio)):
        for name, m in module.named_modules():
            if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d)):
                out[f"{root}.{name}"] = m
    return out


def clip_inputs(frames: list[int], mel_bins: int, padded: int | None = None) -> dict[str, torch.Tensor]:
    """What the feature extractor hands the model: clips padded to ``padded`` frames, and the mask."""
    length = padded or max(frames)
    mask = torch.zeros(len(frames), length, dtype=torch.bool)
    for i, n in enumerate(frames):
        mask[i, :n] = True
    return {"input_features": torch.randn(len(frames), length, mel_bins), "input_features_mask": mask}


def run_audio(model: nn.Module, inputs: dict[str, torch.Tensor], backward: bool = True) -> tuple[Tally, Any]:
    """One pass of the clips through the wrapper's audio path, counted (forward, then backward)."""
    inner = getattr(model, "model", model)
    names = _gemm_names(model)
    ran: set[str] = set()
    got: set[str] = set()
    handles = []
    for name, module in names.items():

        def hook(module: nn.Module, args: Any, output: torch.Tensor, name: str = name) -> None:
            ran.add(name)
            if output.requires_grad:
                output.register_hook(lambda grad, name=name: got.add(name))

        handles.append(module.register_forward_hook(hook))
    try:
        with FlopCounterMode(display=False) as counter:
            out = inner.get_audio_features(**inputs, return_dict=True)
        tally = Tally(forward={k: dict(v) for k, v in counter.get_flop_counts().items()})
        if backward:
            with FlopCounterMode(display=False) as counter:
                out.pooler_output.float().sum().backward()
            tally.backward = dict(counter.get_flop_counts()["Global"])
    finally:
        for handle in handles:
            handle.remove()
    tally.gemms, tally.got_gradient = ran, got
    return tally, out


def forward_flops(
    tally: Tally,
    component: Callable[[str], str] = _component,
    attention: str = rf"{TOWER}\.layers\.\d+\.self_attn",
) -> dict[str, int]:
    """Forward FLOPs (2 per multiply-add) by component; every counted FLOP placed. `component`
    names a GEMM module's component; `attention` matches the attention modules, whose own matmuls
    are what they ran beyond their projections."""
    counts = {name: sum(ops.values()) for name, ops in tally.forward.items()}
    out: dict[str, int] = defaultdict(int)
    for name in tally.gemms:
        out[component(name)] += counts.get(name, 0)
    for name, total in counts.items():
        if re.fullmatch(attention, name):
            projections = sum(v for n, v in counts.items() if n.startswith(f"{name}.") and n in tally.gemms)
            out["core_chunked"] += total - projections
    assert sum(out.values()) == counts["Global"], (dict(out), counts["Global"])
    return dict(out)


def measured_flops(tally: Tally) -> dict[str, int]:
    """The forward counts as forward plus backward at 6 FLOPs per multiply-add: 3 x forward."""
    return {k: 3 * v for k, v in forward_flops(tally).items()}


def op_totals(counts: dict[Any, int]) -> dict[str, int]:
    """{op name: FLOPs}, addmm folded into mm (its backward is mm)."""
    out: dict[str, int] = defaultdict(int)
    for op, value in counts.items():
        name = str(op).split(".")[-1]
        out["mm" if name == "addmm" else name] += value
    return dict(out)
