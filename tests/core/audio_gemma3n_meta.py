"""The independent check's instruments for Gemma 3n's audio tower: what transformers' own modules compute.

Nothing here uses packscope's formula. ``run_audio`` runs the audio path of ``Gemma3nModel.forward``
on clips, module by module as that forward calls them: ``Gemma3nAudioEncoder`` on the features and
the inverted mask, ``embed_audio`` on its output, and ``embed_audio`` on the one padding token
(the last audio id) that pads each clip's tokens to ``audio_soft_tokens_per_image``; all under
torch's ``FlopCounterMode``, which counts every matmul and convolution as executed (padding
included), by the module it ran in. The components are read from the module names; the
attention's own matmuls (QKᵀ, the position logits, P·V) are what its module ran beyond its
projections. The backward pass is counted too, and hooks record which GEMM outputs got a gradient.
"""

from __future__ import annotations

import re
from typing import Any

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from tests.core.audio_gemma4_meta import Tally, clip_inputs, op_totals
from tests.core.audio_gemma4_meta import forward_flops as gemma4_forward_flops

TOWER, EMBED = "Gemma3nAudioEncoder", "Gemma3nMultimodalEmbedder"
_BLOCK = rf"{TOWER}\.conformer\.\d+"

__all__ = ["Tally", "clip_inputs", "forward_flops", "measured_flops", "op_totals", "run_audio"]


def _component(name: str) -> str:
    """Where a GEMM module of the tower or of embed_audio sits, from its name; else the check fails."""
    if name.startswith(f"{TOWER}.subsample_conv_projection."):
        return "conv"
    projections = r"attn\.(q_proj|k_proj|v_proj|relative_position_embedding\.pos_proj)|post"
    if re.fullmatch(rf"{_BLOCK}\.attention\.({projections})", name):
        return "attention"
    if re.fullmatch(rf"{_BLOCK}\.lconv1d\.\w+", name):
        return "lconv"
    if re.fullmatch(rf"{_BLOCK}\.ffw_layer_(start|end)\.ffw_layer_[12]", name):
        return "mlp"
    if name == f"{EMBED}.embedding_projection":
        return "projector"
    raise AssertionError(f"a GEMM at {name!r} that the check does not place")


def run_audio(tower: nn.Module, embed: nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[Tally, Any]:
    """One pass of the clips through Gemma 3n's audio path, counted (forward, then backward)."""
    names = {
        f"{root}.{name}": m
        for root, module in ((TOWER, tower), (EMBED, embed))
        for name, m in module.named_modules()
        if isinstance(m, (nn.Linear, nn.Conv1d, nn.Conv2d))
    }
    ran: set[str] = set()
    got: set[str] = set()
    handles = []
    for name, module in names.items():

        def hook(module: nn.Module, args: Any, output: torch.Tensor, name: str = name) -> None:
            ran.add(name)
            if output.requires_grad:
                output.register_hook(lambda grad, name=name: got.add(name))

        handles.append(module.register_forward_hook(hook))
    padding_id = embed.vocab_offset + embed.vocab_size - 1  # the forward's audio_padding_toks
    try:
        with FlopCounterMode(display=False) as counter:
            out = tower(inputs["input_features"], ~inputs["input_features_mask"], return_dict=True)
            features = embed(inputs_embeds=out.last_hidden_state)
            padding = embed(input_ids=torch.tensor([[padding_id]]))
        tally = Tally(forward={k: dict(v) for k, v in counter.get_flop_counts().items()})
        with FlopCounterMode(display=False) as counter:
            (features.float().sum() + padding.float().sum()).backward()
        tally.backward = dict(counter.get_flop_counts()["Global"])
    finally:
        for handle in handles:
            handle.remove()
    tally.gemms, tally.got_gradient = ran, got
    return tally, (out, features)


def forward_flops(tally: Tally) -> dict[str, int]:
    """Forward FLOPs (2 per multiply-add) by component; every counted FLOP placed."""
    return gemma4_forward_flops(tally, _component, rf"{_BLOCK}\.attention\.attn")


def measured_flops(tally: Tally) -> dict[str, int]:
    """The forward counts as forward plus backward at 6 FLOPs per multiply-add: 3 x forward."""
    return {k: 3 * v for k, v in forward_flops(tally).items()}
