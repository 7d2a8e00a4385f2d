"""The audio tower of an omni model transformers builds, read off its modules (docs/flops.md,
"Audio towers").

Qwen3-Omni's thinker holds ``audio_tower`` (``Qwen3OmniMoeAudioEncoder``) beside its vision tower
and decoder. Its widths are read off the modules and the formula (``packscope.core.audio``) is
held to them: the three front-end convolutions are 3 x 3, stride 2, padding 1, one group; every
layer's GEMMs are q, k, v, o, fc1 and fc2 of the first; ``conv_out`` reads what the convolutions
leave of the mel axis; ``proj1`` and ``proj2`` run once per token; no other GEMM is in the tower.
Gemma 4's and Gemma 3n's towers and their ``embed_audio`` are read in
``packscope.agent.hf_audio_gemma4``. Any other
audio tower is refused in one line naming its class.
"""

from __future__ import annotations

from typing import Any

from packscope.agent.hf_audio_gemma4 import gemma3n_audio_tower, gemma4_audio_tower
from packscope.core.audio import CONV_KERNEL, AudioSpec
from packscope.core.audio_gemma4 import Gemma4AudioSpec
from packscope.core.hf_fields import HFConfigError

# Audio tower classes the count reads, by the tower name their spec takes.
AUDIO_TOWERS = {
    "Qwen3OmniMoeAudioEncoder": "qwen3_omni",
    "Gemma4AudioModel": "gemma4",
    "Gemma3nAudioEncoder": "gemma3n",
}
# The projector a wrapper keeps beside an audio tower, by the wrapper's name for it.
AUDIO_PROJECTORS = {"Gemma4AudioModel": "embed_audio", "Gemma3nAudioEncoder": "embed_audio"}


def _refuse(mt: str, tower: Any, why: str) -> HFConfigError:
    return HFConfigError(f"{mt}: the audio tower ({type(tower).__name__}) is not counted: {why}")


def _linear_macs(module: Any) -> int:
    from torch import nn

    return sum(m.in_features * m.out_features for m in module.modules() if isinstance(m, nn.Linear))


def _is_gemm(module: Any) -> bool:
    from torch import nn

    return isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))


def _check_conv(mt: str, tower: Any, conv: Any, name: str, channels_in: int, channels: int) -> None:
    from torch import nn

    side, step, pad = (CONV_KERNEL, CONV_KERNEL), (2, 2), (1, 1)
    if (
        not isinstance(conv, nn.Conv2d)
        or (tuple(conv.kernel_size), tuple(conv.stride), tuple(conv.padding)) != (side, step, pad)
        or conv.groups != 1
        or conv.dilation != (1, 1)
        or (conv.in_channels, conv.out_channels) != (channels_in, channels)
    ):
        raise _refuse(
            mt, tower, f"its {name} is not a 3 x 3, stride-2 convolution {channels_in} -> {channels} channels"
        )


def audio_tower(mt: str, tower: Any) -> AudioSpec:
    """The AudioSpec of a Qwen3-Omni audio encoder, every GEMM of it placed and checked."""
    from torch import nn

    config = tower.config
    layers = list(tower.layers)
    if not layers:
        raise _refuse(mt, tower, "it has no encoder layers")
    attn = layers[0].self_attn
    hidden, heads = attn.embed_dim, attn.num_heads
    channels = tower.conv2d1.out_channels
    for name, channels_in in (("conv2d1", 1), ("conv2d2", channels), ("conv2d3", channels)):
        _check_conv(mt, tower, getattr(tower, name), name, channels_in, channels)
    try:
        spec = AudioSpec(
            tower=AUDIO_TOWERS[type(tower).__name__],
            layers=len(layers),
            hidden=hidden,
            heads=heads,
            ffn=layers[0].fc1.out_features,
            mel_bins=config.num_mel_bins,
            conv_channels=channels,
            n_window=tower.n_window,
            n_window_infer=tower.n_window_infer,
            projector=(
                (tower.proj1.in_features, tower.proj1.out_features),
                (tower.proj2.in_features, tower.proj2.out_features),
            ),
        )
    except ValueError as exc:
        raise _refuse(mt, tower, str(exc)) from None
    if not all(isinstance(m, nn.Linear) for m in (tower.conv_out, tower.proj1, tower.proj2)):
        raise _refuse(mt, tower, "its conv_out, proj1 and proj2 are not each one nn.Linear")
    if tower.proj1.in_features != hidden:
        raise _refuse(mt, tower, f"its proj1 does not read the {hidden}-wide encoder output")
    if (tower.conv_out.in_features, tower.conv_out.out_features) != (spec.conv_out_inputs, hidden):
        raise _refuse(mt, tower, f"its conv_out does not read {spec.conv_out_inputs} values into {hidden}")
    per_layer = 4 * hidden * hidden + 2 * hidden * spec.ffn
    for i, layer in enumerate(layers):
        convolutions = [m for m in layer.modules() if _is_gemm(m) and not isinstance(m, nn.Linear)]
        if _linear_macs(layer) != per_layer or convolutions:
            raise _refuse(mt, tower, f"layer {i}'s GEMMs are not q, k, v, o, fc1 and fc2 of the others")
    front = (tower.conv2d1, tower.conv2d2, tower.conv2d3, tower.conv_out)
    placed = {id(m) for part in (*layers, *front, tower.proj1, tower.proj2) for m in part.modules()}
    for sub, module in tower.named_modules():
        if _is_gemm(module) and id(module) not in placed:
            raise _refuse(mt, tower, f"its module '{sub}' ({type(module).__name__}) is not placed")
    return spec


def audio_from_structure(
    model: Any, mt: str, towers: dict[str, Any]
) -> tuple[AudioSpec | Gemma4AudioSpec | None, list[Any]]:
    """(the audio tower's spec or None, the tower modules placed) among a built wrapper's towers."""
    found = [(name, t) for name, t in towers.items() if type(t).__name__ in AUDIO_TOWERS]
    if not found:
        return None, []
    if len(found) > 1:
        raise HFConfigError(f"{mt}: {len(found)} audio towers ({', '.join(n for n, _ in found)}); packscope counts one")
    ((_, tower),) = found
    projector = AUDIO_PROJECTORS.get(type(tower).__name__)
    if projector is None:
        return audio_tower(mt, tower), [tower]
    if projector not in towers:
        raise HFConfigError(f"{mt}: the audio tower ({type(tower).__name__}) has no '{projector}' beside it")
    read = gemma3n_audio_tower if type(tower).__name__ == "Gemma3nAudioEncoder" else gemma4_audio_tower
    return read(mt, tower, towers[projector]), [tower, towers[projector]]


__all__ = ["AUDIO_PROJECTORS", "AUDIO_TOWERS", "audio_from_structure", "audio_tower"]
