"""Gemma 4's audio tower as transformers builds it, read off its modules (docs/flops.md, "Audio
towers", "Gemma 4").

``Gemma4Model`` holds ``audio_tower`` (``Gemma4AudioModel``) and ``embed_audio`` (a
``Gemma4MultimodalEmbedder``) beside its decoder. The widths are read off the modules and the
formula (``packscope.core.audio_gemma4``) is held to them: the two front-end convolutions are
3 x 3, stride 2, padding 1, one group; ``input_proj_linear`` reads what they leave of the mel axis;
every layer's GEMMs are exactly the formula's (two feed-forward blocks, q, k, v, post,
relative_k_proj, linear_start, the depthwise convolution, linear_end), each of the widths the
formula prices; ``output_proj`` and ``embed_audio`` run once per position; no other GEMM is in
either module.

Gemma 3n's ``Gemma3nAudioEncoder`` (``gemma3n_audio_tower``) is read the same way under its own
module names: its subsampling blocks pad by hand what Gemma 4's convolutions pad themselves, its
``pos_proj`` projects left + right relative positions, and it has no ``output_proj``
(``conf_reduction_factor`` thins the layers' output before ``embed_audio``).
"""

from __future__ import annotations

from typing import Any

from packscope.core.audio import CONV_KERNEL, halve
from packscope.core.audio_gemma4 import Gemma4AudioSpec
from packscope.core.hf_fields import HFConfigError


def _refuse(mt: str, tower: Any, why: str) -> HFConfigError:
    return HFConfigError(f"{mt}: the audio tower ({type(tower).__name__}) is not counted: {why}")


def _is_gemm(module: Any) -> bool:
    from torch import nn

    return isinstance(module, (nn.Linear, nn.Conv1d, nn.Conv2d, nn.Conv3d))


def _shape(module: Any) -> tuple[Any, ...]:
    """What a GEMM module's work per output position depends on, to compare with the formula's."""
    from torch import nn

    if isinstance(module, nn.Linear):
        return ("linear", module.in_features, module.out_features)
    return (
        f"conv{len(module.kernel_size)}d",
        module.in_channels,
        module.out_channels,
        tuple(module.kernel_size),
        tuple(module.stride),
        tuple(module.dilation),
        tuple(module.padding),
        module.groups,
    )


def _conformer_gemms(
    spec: Gemma4AudioSpec, feed_forwards: tuple[str, ...], squares: tuple[str, ...], lconv: str, linear: str = ""
) -> dict[str, tuple[Any, ...]]:
    """The GEMMs of one conformer layer, by name, as the formula prices them: the two feed-forward
    blocks' in and out projections (`feed_forwards`: each block's ffw_layer_1 and ffw_layer_2
    names, without `linear`), the hidden x hidden attention projections (`squares`, whole names)
    and the light convolution's (`lconv`, its prefix). `linear` follows the names of a tower's
    wrapped linears (Gemma 4's clipped ones: ".linear")."""
    d, f = spec.hidden, spec.ffn
    out: dict[str, tuple[Any, ...]] = {}
    for block in feed_forwards:
        out[f"{block}.ffw_layer_1{linear}"] = ("linear", d, f)
        out[f"{block}.ffw_layer_2{linear}"] = ("linear", f, d)
    for name in squares:
        out[name] = ("linear", d, d)
    out[f"{lconv}.linear_start{linear}"] = ("linear", d, 2 * d)
    out[f"{lconv}.linear_end{linear}"] = ("linear", d, d)
    # depthwise, stride 1: the causal padding is added before it (left_pad), so every position has an output
    out[f"{lconv}.depthwise_conv1d"] = ("conv1d", d, d, (spec.lconv_kernel,), (1,), (1,), (0,), d)
    return out


def _check_placed(
    mt: str,
    tower: Any,
    layers: Any,
    expected: dict[str, tuple[Any, ...]],
    others: tuple[Any, ...],
    embed: Any,
    unit: str = "layer",
) -> None:
    """Every layer holds the GEMMs priced and no others; every other GEMM of the tower is in one of
    `others` (the parts priced apart); the embedder is one projection."""
    for i, layer in enumerate(layers):
        found = {name: _shape(m) for name, m in layer.named_modules() if _is_gemm(m)}
        if found != expected:
            raise _refuse(mt, tower, f"{unit} {i}'s GEMMs are not the feed-forward, attention and lconv1d ones priced")
    placed = {id(m) for part in (*layers, *others) for m in part.modules()}
    for sub, module in tower.named_modules():
        if _is_gemm(module) and id(module) not in placed:
            raise _refuse(mt, tower, f"its module '{sub}' ({type(module).__name__}) is not placed")
    if [m for m in embed.modules() if _is_gemm(m)] != [embed.embedding_projection]:
        raise _refuse(mt, tower, "its embed_audio is not one projection")


def _conv(mt: str, tower: Any, conv: Any, name: str, channels_in: int) -> int:
    """The output channels of a 3 x 3, stride-2, padding-1 convolution reading ``channels_in``."""
    from torch import nn

    side, step, pad = (CONV_KERNEL, CONV_KERNEL), (2, 2), (1, 1)
    if (
        not isinstance(conv, nn.Conv2d)
        or (tuple(conv.kernel_size), tuple(conv.stride), tuple(conv.padding)) != (side, step, pad)
        or (conv.groups, tuple(conv.dilation), conv.in_channels) != (1, (1, 1), channels_in)
    ):
        raise _refuse(mt, tower, f"its {name} is not a 3 x 3, stride-2 convolution reading {channels_in} channel(s)")
    return int(conv.out_channels)


def gemma4_audio_tower(mt: str, tower: Any, embed: Any) -> Gemma4AudioSpec:
    """The spec of Gemma 4's audio tower and its ``embed_audio``, every GEMM of both placed and checked."""
    from torch import nn

    front = tower.subsample_conv_projection
    c0 = _conv(mt, tower, front.layer0.conv, "layer0.conv", 1)
    c1 = _conv(mt, tower, front.layer1.conv, "layer1.conv", c0)
    proj = front.input_proj_linear
    layers = list(tower.layers)
    if not layers:
        raise _refuse(mt, tower, "it has no layers")
    if not isinstance(proj, nn.Linear) or proj.in_features % c1:
        raise _refuse(mt, tower, f"its input_proj_linear does not read {c1} channels x the mel bins left")
    # The config holds no mel width: input_proj_linear fixes what two halvings leave of it (m2),
    # and the feature extractor's 128 bins (feature_size) are 4 · m2 of the published tower.
    mel_bins = 4 * (proj.in_features // c1)
    attn = layers[0].self_attn
    if attn.num_heads * attn.head_dim != proj.out_features:
        raise _refuse(mt, tower, f"its attention ({attn.num_heads} x {attn.head_dim}) is not {proj.out_features} wide")
    if tower.rel_pos_enc.context_size != attn.context_size:
        raise _refuse(mt, tower, "its relative positions do not span the attention's context")
    try:
        spec = Gemma4AudioSpec(
            tower="gemma4",
            layers=len(layers),
            hidden=proj.out_features,
            heads=attn.num_heads,
            ffn=layers[0].feed_forward1.ffw_layer_1.linear.out_features,
            conv_channels=(c0, c1),
            mel_bins=mel_bins,
            lconv_kernel=layers[0].lconv1d.depthwise_conv1d.kernel_size[0],
            chunk=attn.chunk_size,
            context_left=attn.max_past_horizon + 1,
            context_right=attn.max_future_horizon,
            projector=(
                (tower.output_proj.in_features, tower.output_proj.out_features),
                (embed.embedding_projection.in_features, embed.embedding_projection.out_features),
            ),
        )
    except (ValueError, AttributeError) as exc:
        raise _refuse(mt, tower, str(exc)) from None
    if halve(halve(spec.mel_bins)) * c1 != proj.in_features:
        raise _refuse(mt, tower, f"its input_proj_linear reads {proj.in_features} values, not C1 x the mel bins left")
    if tower.output_proj.in_features != spec.hidden or embed.embedding_projection.in_features != (
        tower.output_proj.out_features
    ):
        raise _refuse(mt, tower, "its output_proj and embed_audio do not read the layers' output in turn")
    squares = (
        *(f"self_attn.{name}.linear" for name in ("q_proj", "k_proj", "v_proj", "post")),
        "self_attn.relative_k_proj",
    )
    expected = _conformer_gemms(spec, ("feed_forward1", "feed_forward2"), squares, "lconv1d", linear=".linear")
    _check_placed(mt, tower, layers, expected, (front, tower.output_proj), embed)
    return spec


def _gemma3n_conv(mt: str, tower: Any, block: Any, name: str, channels_in: int) -> int:
    """The output channels of a subsampling block: a 3 x 3, stride-2 convolution that its block pads
    by hand one bin each side of the mel axis and two frames after the time axis (so it leaves
    (x - 1) // 2 + 1 of each, as a padding-1 one), reading ``channels_in``."""
    from torch import nn

    conv = block.conv
    if (
        not isinstance(conv, nn.Conv2d)
        or (tuple(conv.kernel_size), tuple(conv.stride), tuple(conv.padding)) != ((3, 3), (2, 2), (0, 0))
        or (conv.groups, tuple(conv.dilation), conv.in_channels) != (1, (1, 1), channels_in)
        or tuple(block.manual_padding) != (1, 1, 0, CONV_KERNEL - 1)
    ):
        raise _refuse(
            mt, tower, f"its {name} is not a 3 x 3, stride-2 convolution padded (1, 1, 0, 2) reading {channels_in}"
        )
    return int(conv.out_channels)


def gemma3n_audio_tower(mt: str, tower: Any, embed: Any) -> Gemma4AudioSpec:
    """The spec of Gemma 3n's audio tower (``Gemma3nAudioEncoder``) and its ``embed_audio``, every GEMM
    of both placed and checked: Gemma 4's computation but for the relative positions ``pos_proj``
    projects (left + right) and the reduction of the layers' output before ``embed_audio``."""
    from torch import nn

    config = tower.config
    front = tower.subsample_conv_projection
    c0 = _gemma3n_conv(mt, tower, front.conv_0, "conv_0.conv", 1)
    c1 = _gemma3n_conv(mt, tower, front.conv_1, "conv_1.conv", c0)
    proj = front.input_proj_linear
    layers = list(tower.conformer)
    if not layers:
        raise _refuse(mt, tower, "it has no conformer blocks")
    if not isinstance(proj, nn.Linear):
        raise _refuse(mt, tower, "its input_proj_linear is not one nn.Linear")
    attn = layers[0].attention.attn
    rel = attn.relative_position_embedding
    if attn.num_heads * attn.head_dim != proj.out_features:
        raise _refuse(mt, tower, f"its attention ({attn.num_heads} x {attn.head_dim}) is not {proj.out_features} wide")
    if (rel.max_backward, rel.max_forward) != (attn.max_past_horizon, attn.max_future_horizon):
        raise _refuse(mt, tower, "its relative positions do not span the attention's context")
    try:
        spec = Gemma4AudioSpec(
            tower="gemma3n",
            layers=len(layers),
            hidden=proj.out_features,
            heads=attn.num_heads,
            ffn=layers[0].ffw_layer_start.ffw_layer_1.out_features,
            conv_channels=(c0, c1),
            mel_bins=config.input_feat_size,
            lconv_kernel=layers[0].lconv1d.depthwise_conv1d.kernel_size[0],
            chunk=attn.chunk_size,
            context_left=attn.max_past_horizon + 1,
            context_right=attn.max_future_horizon,
            projector=((embed.embedding_projection.in_features, embed.embedding_projection.out_features),),
            reduction=config.conf_reduction_factor,
        )
    except (ValueError, AttributeError) as exc:
        raise _refuse(mt, tower, str(exc)) from None
    if spec.context != attn.context_size:
        raise _refuse(mt, tower, f"its blocks see {attn.context_size} key slots, not {spec.context}")
    if spec.input_proj_inputs != proj.in_features:
        raise _refuse(mt, tower, f"its input_proj_linear reads {proj.in_features} values, not C1 x the mel bins left")
    if embed.embedding_projection.in_features != spec.hidden:
        raise _refuse(mt, tower, "its embed_audio does not read the layers' output")
    attention = ("q_proj", "k_proj", "v_proj", "relative_position_embedding.pos_proj")
    squares = (*(f"attention.attn.{name}" for name in attention), "attention.post")
    expected = _conformer_gemms(spec, ("ffw_layer_start", "ffw_layer_end"), squares, "lconv1d")
    _check_placed(mt, tower, layers, expected, (front,), embed, unit="block")
    return spec


__all__ = ["gemma3n_audio_tower", "gemma4_audio_tower"]
