"""Gemma 4's audio tower: its FLOPs and the sums of a batch's audio clips that they multiply
(docs/flops.md, "Audio towers", "Gemma 4").

GEMM work only, forward plus backward, 6 FLOPs per multiply-add, as for Qwen3-Omni's tower
(``packscope.core.audio``). ``Gemma4AudioModel`` and the wrapper's ``embed_audio`` run, on one call
with every clip of a micro-batch (mel frames n_1 … n_B, ``input_features_mask.sum(1)``, padded to
the call's length T, ``input_features.shape[1]``), at every padded position:

* two 3 x 3 stride-2 convolutions over [T, mel] (1 -> C0 -> C1 channels), then
  ``input_proj_linear`` (C1 x the mel bins left -> d) at each of the g²(T) positions,
  g(x) = (x - 1) // 2 + 1;
* per layer and position: two feed-forward blocks (d -> ffn -> d), q, k, v and ``post`` (d x d),
  ``lconv1d``'s ``linear_start`` (d -> 2d), a depthwise causal convolution of the GLU's d channels
  and ``linear_end`` (d -> d);
* ``output_proj`` (d -> output dims), then ``embed_audio`` (output dims -> the decoder's width);
* per layer and call: ``relative_k_proj`` (d x d) on the P = context // 2 + 1 relative positions,
  whatever the batch;
* per layer and block: the positions of each clip cut into blocks of ``chunk`` queries (the last
  one padded), each attending over ``context`` = chunk + left - 1 + right key slots: QKᵀ over the
  slots, the position logits over P, P·V over the slots. The mask (a causal window) is applied to
  the scores after they are computed, so the count is of every slot of every block: what runs.

The sums, over the tower calls of an interval (one per micro-batch), are:

* ``audio_clips``, ``audio_tokens`` (Σ g²(n_i): the valid positions, the decoder's audio tokens): shown;
* ``audio_calls``: calls of the tower; ``audio_conv1_frames``: Σ B · g(T);
* ``audio_positions``: Σ B · g²(T); ``audio_blocks``: Σ B · ceil(g²(T) / chunk).

Gemma 3n's tower (``Gemma3nAudioEncoder``, tower ``gemma3n``) is the same computation with two
differences, both read off its modules: ``pos_proj`` projects left + right relative positions
(``Gemma3nAudioRelativePositionEmbedding``: max_backward + max_forward + 1), and it has no
``output_proj``: the layers' output keeps every r-th position (``conf_reduction_factor``), and
``embed_audio`` projects those, ⌈g²(T) / r⌉ a clip, plus one padding token per call (the embedding
of the last audio id that pads each clip's tokens to ``audio_soft_tokens_per_image``). Its
``audio_tokens`` are those output positions, Σ B · ⌈g²(T) / r⌉: what ``embed_audio`` projects and
the decoder's audio placeholders take (each clip padded to the call's longest).

Not counted: norms, activations, clamps, biases, the sinusoidal positions, softmax, the soft cap.

Pure Python, like the rest of ``packscope.core``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from packscope.core.audio import CONV_KERNEL, halve, priced, summed_calls, total
from packscope.core.model_fields import check_int, dict_fields

AUDIO_CLIPS = "audio_clips"
AUDIO_CALLS = "audio_calls"
AUDIO_CONV1_FRAMES = "audio_conv1_frames"
AUDIO_POSITIONS = "audio_positions"
AUDIO_BLOCKS = "audio_blocks"
AUDIO_TOKENS = "audio_tokens"
GEMMA4_AUDIO_SUMS = (AUDIO_CLIPS, AUDIO_CALLS, AUDIO_CONV1_FRAMES, AUDIO_POSITIONS, AUDIO_BLOCKS, AUDIO_TOKENS)
GEMMA4_AUDIO_COMPONENTS = ("conv", "attention", "lconv", "mlp", "projector", "core_chunked")
# Gemma4AudioModel and Gemma3nAudioEncoder (USM Conformers), each with the wrapper's embed_audio
GEMMA4_AUDIO_TOWERS = ("gemma4", "gemma3n")


def halve2(x: int) -> int:
    return halve(halve(x))


@dataclass(frozen=True)
class Gemma4AudioSpec:
    """What the FLOPs formula needs to know about Gemma 4's audio tower (widths read off its modules)."""

    tower: str
    layers: int
    hidden: int  # d: the layers' width
    heads: int
    ffn: int  # each feed-forward block's inner width
    conv_channels: tuple[int, int]  # subsampling_conv_channels: C0, C1
    mel_bins: int  # the mel axis the convolutions read (the feature extractor's feature_size)
    lconv_kernel: int  # the depthwise causal convolution's width
    chunk: int  # attention_chunk_size: queries of a block
    context_left: int  # attention_context_left: the block's key slots before it, itself included
    context_right: int  # attention_context_right
    projector: tuple[tuple[int, int], ...] = ()  # Gemma 4: output_proj, embed_audio, once per position
    reduction: int = 1  # Gemma 3n: conf_reduction_factor, the layers' output keeps every r-th position

    def __post_init__(self) -> None:
        if self.tower not in GEMMA4_AUDIO_TOWERS:
            raise ValueError(f"audio field 'tower' must be one of {', '.join(GEMMA4_AUDIO_TOWERS)}, got {self.tower!r}")
        sizes = ("layers", "hidden", "heads", "ffn", "mel_bins", "lconv_kernel", "chunk", "context_left", "reduction")
        for key in sizes:
            check_int(f"audio.{key}", getattr(self, key), minimum=1)
        check_int("audio.context_right", self.context_right, minimum=0)
        if self.reduction != 1 and self.tower != "gemma3n":
            raise ValueError(f"audio.reduction is Gemma 3n's; the {self.tower} tower keeps every position")
        if self.hidden % self.heads:
            raise ValueError(f"audio.hidden ({self.hidden}) is not divisible by audio.heads ({self.heads})")
        channels = self.conv_channels
        if not isinstance(channels, (list, tuple)) or len(channels) != 2:
            raise ValueError(f"audio.conv_channels must be [C0, C1], got {channels!r}")
        object.__setattr__(
            self, "conv_channels", tuple(check_int(f"audio.conv_channels[{i}]", c, 1) for i, c in enumerate(channels))
        )
        pairs = []
        for i, pair in enumerate(self.projector):
            if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                raise ValueError(f"audio.projector[{i}] must be an [in, out] pair, got {pair!r}")
            pairs.append(
                (check_int(f"audio.projector[{i}]", pair[0], 1), check_int(f"audio.projector[{i}]", pair[1], 1))
            )
        object.__setattr__(self, "projector", tuple(pairs))

    # -- derived sizes ---------------------------------------------------------------------------
    @property
    def context(self) -> int:
        """Key slots of a block (``Gemma4AudioAttention.context_size``)."""
        return self.chunk + self.context_left - 1 + self.context_right

    @property
    def rel_positions(self) -> int:
        """Relative positions ``relative_k_proj`` projects (``Gemma4AudioRelPositionalEncoding``), or
        Gemma 3n's ``pos_proj`` (left - 1 past, right future and the position itself)."""
        if self.tower == "gemma3n":
            return self.context_left + self.context_right
        return self.context // 2 + 1

    @property
    def mel_after(self) -> tuple[int, int]:
        """The mel axis after each convolution."""
        return halve(self.mel_bins), halve2(self.mel_bins)

    @property
    def input_proj_inputs(self) -> int:
        """Values ``input_proj_linear`` reads per position: C1 x mel bins left."""
        return self.conv_channels[1] * self.mel_after[1]

    # -- the formula -----------------------------------------------------------------------------
    @property
    def c_by_sum(self) -> dict[str, dict[str, int]]:
        """FLOPs per unit of each sum, by component (6 per multiply-add)."""
        k2, (c0, c1), d, n = CONV_KERNEL**2, self.conv_channels, self.hidden, self.layers
        m1, m2 = self.mel_after
        projector = 6 * sum(i * o for i, o in self.projector)
        out = {
            AUDIO_CONV1_FRAMES: {"conv": 6 * k2 * c0 * m1},
            AUDIO_POSITIONS: {
                "conv": 6 * (k2 * c0 * c1 * m2 + self.input_proj_inputs * d),
                "attention": 6 * n * 4 * d * d,
                "lconv": 6 * n * (2 * d * d + d * d + self.lconv_kernel * d),
                "mlp": 6 * n * 2 * 2 * d * self.ffn,
                "projector": projector,
            },
            AUDIO_CALLS: {"attention": 6 * n * self.rel_positions * d * d},
            AUDIO_BLOCKS: {"core_chunked": 6 * n * self.chunk * d * (2 * self.context + self.rel_positions)},
        }
        if self.tower == "gemma3n":  # embed_audio on the kept positions, and on the padding token once a call
            out[AUDIO_POSITIONS]["projector"] = 0
            out[AUDIO_TOKENS] = {"projector": projector}
            out[AUDIO_CALLS]["projector"] = projector
        return out

    def flops_by_component(self, sums: Mapping[str, Any]) -> dict[str, Any]:
        return priced(self.c_by_sum, GEMMA4_AUDIO_COMPONENTS, sums)

    def flops(self, sums: Mapping[str, Any]) -> Any:
        return total(self.flops_by_component(sums))

    def batch_sums(self, calls: Iterable[Iterable[int]]) -> dict[str, int]:
        """The sums of these micro-batches, each padded to its longest clip (``batch_sums``)."""
        return batch_sums(self, calls)

    # -- (de)serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["conv_channels"] = list(self.conv_channels)
        out["projector"] = [list(pair) for pair in self.projector]
        if self.tower != "gemma3n":  # Gemma 4's dict as it was
            del out["reduction"]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> Gemma4AudioSpec:
        return cls(**dict_fields("model audio", cls, data, ()))


# -- the reference sums ----------------------------------------------------------------------------


def call_sums(audio: Gemma4AudioSpec, frames: Iterable[int], padded: int | None = None) -> dict[str, int]:
    """The sums of one call of the tower on clips of these mel-frame counts (one micro-batch),
    padded to ``padded`` frames (``input_features.shape[1]``; the longest clip if not given)."""
    lengths = []
    for n in frames:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"an audio clip is an integer >= 1 of mel frames, got {n!r}")
        lengths.append(n)
    out = dict.fromkeys(GEMMA4_AUDIO_SUMS, 0)
    if not lengths:
        return out
    longest = max(lengths) if padded is None else padded
    if isinstance(longest, bool) or not isinstance(longest, int) or longest < max(lengths):
        raise ValueError(f"a call's padded length is an integer >= its longest clip ({max(lengths)}), got {padded!r}")
    clips, positions = len(lengths), halve2(longest)
    out[AUDIO_CLIPS] = clips
    out[AUDIO_CALLS] = 1
    out[AUDIO_CONV1_FRAMES] = clips * halve(longest)
    out[AUDIO_POSITIONS] = clips * positions
    out[AUDIO_BLOCKS] = clips * -(-positions // audio.chunk)
    # Gemma 3n: every clip's kept positions (padding included); Gemma 4: the valid ones
    out[AUDIO_TOKENS] = (
        clips * -(-positions // audio.reduction) if audio.tower == "gemma3n" else sum(halve2(n) for n in lengths)
    )
    return out


def batch_sums(audio: Gemma4AudioSpec, calls: Iterable[Iterable[int]]) -> dict[str, int]:
    """The sums of several calls (micro-batches), each a list of clips' mel-frame counts."""
    return summed_calls(lambda frames: call_sums(audio, frames), GEMMA4_AUDIO_SUMS, calls)


__all__ = [
    "AUDIO_BLOCKS",
    "AUDIO_CALLS",
    "AUDIO_CONV1_FRAMES",
    "AUDIO_POSITIONS",
    "GEMMA4_AUDIO_COMPONENTS",
    "GEMMA4_AUDIO_SUMS",
    "GEMMA4_AUDIO_TOWERS",
    "Gemma4AudioSpec",
    "batch_sums",
    "call_sums",
]
