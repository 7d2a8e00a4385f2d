"""The audio tower of an omni model (Qwen3-Omni's thinker): its FLOPs and the sums of a batch's
audio clips that they multiply (docs/flops.md, "Audio towers").

GEMM work only, forward plus backward, 6 FLOPs per multiply-add, as for the decoder and the
vision towers. Qwen3-Omni's ``Qwen3OmniMoeAudioEncoder`` runs, on one call with every clip of a
micro-batch (mel frames n_1 … n_B, ``feature_attention_mask.sum(1)``):

* each clip cut into chunks of ``2 · n_window`` frames (the last one shorter), every chunk padded
  to the batch's longest chunk L (``chunk_and_pad_features``); three 3 x 3 stride-2 convolutions
  over (mel bins, L), and ``conv_out`` (a Linear over channels x mel bins left) at every time
  position of every padded chunk: padding included, it is work the tower does;
* the valid positions only (``get_valid_indices``: g³(c) of a chunk of c frames, g(x) =
  (x - 1) // 2 + 1) through the encoder layers (q, k, v, o, fc1, fc2) and ``proj1``, ``proj2``;
* attention within windows (``get_audio_cu_seqlens``): each clip's tokens cut into windows of
  g³(L) · (n_window_infer // (2 · n_window)) tokens, the last one shorter, every (query, key)
  pair of a window computed (bidirectional): 12 · d_model FLOPs per pair and layer.

The sums, over the tower calls of an interval (one per micro-batch), are:

* ``audio_clips``: clips encoded; ``audio_chunks``: Σ K, the chunks (shown, no coefficient);
* ``audio_conv1_frames``, ``audio_conv2_frames``, ``audio_conv3_frames``: Σ K · gᵏ(L), the time
  positions each convolution's output holds, padding included (conv_out runs on the third's);
* ``audio_tokens``: Σ over clips of the tokens handed to the decoder (the encoder's positions);
* ``audio_sq_sum``: Σ over windows of w².

Not counted: norms, activations, biases, the sinusoidal position embedding, softmax.

Pure Python, like the rest of ``packscope.core``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from packscope.core.attention import chunk_sq
from packscope.core.model_fields import check_int, dict_fields

AUDIO_CLIPS = "audio_clips"
AUDIO_CHUNKS = "audio_chunks"
AUDIO_CONV_FRAMES = ("audio_conv1_frames", "audio_conv2_frames", "audio_conv3_frames")
AUDIO_TOKENS = "audio_tokens"
AUDIO_SQ_SUM = "audio_sq_sum"
AUDIO_SUMS = (AUDIO_CLIPS, AUDIO_CHUNKS, *AUDIO_CONV_FRAMES, AUDIO_TOKENS, AUDIO_SQ_SUM)
AUDIO_COMPONENTS = ("conv", "attention", "mlp", "projector", "core_full")
AUDIO_TOWERS = ("qwen3_omni",)  # Qwen3OmniMoeAudioEncoder (Whisper-like blocks, chunked conv front end)
# Tokens transformers keeps of a full chunk: a constant in its _get_feat_extract_output_lengths.
FULL_CHUNK_TOKENS = 13
CONV_KERNEL = 3  # every convolution of the front end: 3 x 3, stride 2, padding 1


def priced(
    c_by_sum: Mapping[str, Mapping[str, int]], components: Iterable[str], sums: Mapping[str, Any]
) -> dict[str, Any]:
    """An audio tower's FLOPs by component: each sum times its coefficients (ints or tensors alike)."""
    out: dict[str, Any] = dict.fromkeys(components, 0)
    for name, parts in c_by_sum.items():
        for component, c in parts.items():
            out[component] = out[component] + sums[name] * c
    return out


def total(by_component: Mapping[str, Any]) -> Any:
    """The sum of the components' FLOPs, in their order (ints or tensors alike)."""
    out: Any = 0
    for value in by_component.values():
        out = out + value
    return out


def halve(x: int) -> int:
    """The length a 3-wide, stride-2, padding-1 convolution leaves of x: (x - 1) // 2 + 1."""
    return (x - 1) // 2 + 1


def halve3(x: int) -> int:
    return halve(halve(halve(x)))


@dataclass(frozen=True)
class AudioSpec:
    """What the FLOPs formula needs to know about an audio tower (widths read off its modules)."""

    tower: str
    layers: int
    hidden: int  # d_model
    heads: int
    ffn: int  # encoder_ffn_dim: fc1 / fc2
    mel_bins: int  # num_mel_bins: the convolutions' height
    conv_channels: int  # downsample_hidden_size
    n_window: int  # half a conv chunk, in mel frames
    n_window_infer: int  # an attention window, in mel frames (a multiple of 2 · n_window counts)
    projector: tuple[tuple[int, int], ...] = ()  # proj1, proj2: once per token

    def __post_init__(self) -> None:
        if self.tower not in AUDIO_TOWERS:
            raise ValueError(f"audio field 'tower' must be one of {', '.join(AUDIO_TOWERS)}, got {self.tower!r}")
        for key in ("layers", "hidden", "heads", "ffn", "mel_bins", "conv_channels", "n_window", "n_window_infer"):
            check_int(f"audio.{key}", getattr(self, key), minimum=1)
        if self.hidden % self.heads:
            raise ValueError(f"audio.hidden ({self.hidden}) is not divisible by audio.heads ({self.heads})")
        if self.n_window_infer < 2 * self.n_window:
            raise ValueError(
                f"audio.n_window_infer ({self.n_window_infer}) is shorter than a chunk (2 · n_window = "
                f"{2 * self.n_window}): the tower's attention windows would be empty"
            )
        if halve3(self.chunk) != FULL_CHUNK_TOKENS:
            raise ValueError(
                f"audio.n_window {self.n_window}: a chunk of {self.chunk} frames leaves {halve3(self.chunk)} "
                f"positions, but transformers takes {FULL_CHUNK_TOKENS} tokens of every full chunk "
                "(_get_feat_extract_output_lengths); only n_window 49 to 52 is the model it builds"
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
    def chunk(self) -> int:
        """Mel frames of a full conv chunk."""
        return 2 * self.n_window

    @property
    def windows_per_chunk(self) -> int:
        return self.n_window_infer // self.chunk

    @property
    def mel_after(self) -> tuple[int, int, int]:
        """The mel axis after each convolution."""
        m1 = halve(self.mel_bins)
        m2 = halve(m1)
        return m1, m2, halve(m2)

    @property
    def conv_out_inputs(self) -> int:
        """Values conv_out reads per position: channels x mel bins left."""
        return self.conv_channels * self.mel_after[2]

    # -- the formula -----------------------------------------------------------------------------
    @property
    def c_by_sum(self) -> dict[str, dict[str, int]]:
        """FLOPs per unit of each sum, by component (6 per multiply-add; 12 · d per pair and layer)."""
        k2, c, d = CONV_KERNEL**2, self.conv_channels, self.hidden
        m1, m2, m3 = self.mel_after
        proj = sum(i * o for i, o in self.projector)
        return {
            AUDIO_CONV_FRAMES[0]: {"conv": 6 * k2 * c * m1},
            AUDIO_CONV_FRAMES[1]: {"conv": 6 * k2 * c * c * m2},
            AUDIO_CONV_FRAMES[2]: {"conv": 6 * (k2 * c * c * m3 + self.conv_out_inputs * d)},
            AUDIO_TOKENS: {
                "attention": 6 * self.layers * 4 * d * d,
                "mlp": 6 * self.layers * 2 * d * self.ffn,
                "projector": 6 * proj,
            },
            AUDIO_SQ_SUM: {"core_full": 12 * d * self.layers},
        }

    def flops_by_component(self, sums: Mapping[str, Any]) -> dict[str, Any]:
        return priced(self.c_by_sum, AUDIO_COMPONENTS, sums)

    def flops(self, sums: Mapping[str, Any]) -> Any:
        return total(self.flops_by_component(sums))

    def batch_sums(self, calls: Iterable[Iterable[int]]) -> dict[str, int]:
        """The sums of these micro-batches (``batch_sums``)."""
        return batch_sums(self, calls)

    # -- (de)serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out["projector"] = [list(pair) for pair in self.projector]
        return out

    @classmethod
    def from_dict(cls, data: Any) -> AudioSpec:
        return cls(**dict_fields("model audio", cls, data, ()))


# -- the reference sums ----------------------------------------------------------------------------


def clip_chunks(audio: AudioSpec, frames: int) -> list[int]:
    """The conv chunks of a clip of ``frames`` mel frames (``chunk_and_pad_features``)."""
    full, tail = divmod(frames, audio.chunk)
    return [audio.chunk] * full + ([tail] if tail else [])


def clip_tokens(audio: AudioSpec, frames: int) -> int:
    """Tokens the tower hands the decoder for one clip: g³ of each chunk (``_get_feat_extract_output_lengths``)."""
    return sum(halve3(c) for c in clip_chunks(audio, frames))


def call_sums(audio: AudioSpec, frames: Iterable[int]) -> dict[str, int]:
    """The sums of one call of the tower on clips of these mel-frame counts (one micro-batch)."""
    lengths = []
    for n in frames:
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"an audio clip is an integer >= 1 of mel frames, got {n!r}")
        lengths.append(n)
    out = dict.fromkeys(AUDIO_SUMS, 0)
    if not lengths:
        return out
    chunks = [c for n in lengths for c in clip_chunks(audio, n)]
    longest = max(chunks)  # every chunk is padded to it before the convolutions
    k = len(chunks)
    f1 = halve(longest)
    f2 = halve(f1)
    window = halve(f2) * audio.windows_per_chunk  # tokens of an attention window in this call
    out[AUDIO_CLIPS] = len(lengths)
    out[AUDIO_CHUNKS] = k
    out[AUDIO_CONV_FRAMES[0]], out[AUDIO_CONV_FRAMES[1]], out[AUDIO_CONV_FRAMES[2]] = k * f1, k * f2, k * halve(f2)
    tokens = [clip_tokens(audio, n) for n in lengths]
    out[AUDIO_TOKENS] = sum(tokens)
    out[AUDIO_SQ_SUM] = sum(chunk_sq(t, window) for t in tokens)
    return out


def summed_calls(
    one_call: Callable[[Iterable[int]], Mapping[str, int]], names: Iterable[str], calls: Iterable[Iterable[int]]
) -> dict[str, int]:
    """The sums `names` of several calls (micro-batches), each a list of clips' mel-frame counts,
    from one call's sums (any audio tower's `call_sums`)."""
    out = dict.fromkeys(names, 0)
    for frames in calls:
        for name, value in one_call(frames).items():
            out[name] += value
    return out


def batch_sums(audio: AudioSpec, calls: Iterable[Iterable[int]]) -> dict[str, int]:
    """The sums of several calls (micro-batches), each a list of clips' mel-frame counts."""
    return summed_calls(lambda frames: call_sums(audio, frames), AUDIO_SUMS, calls)


__all__ = [
    "AUDIO_CHUNKS",
    "AUDIO_CLIPS",
    "AUDIO_COMPONENTS",
    "AUDIO_CONV_FRAMES",
    "AUDIO_SQ_SUM",
    "AUDIO_SUMS",
    "AUDIO_TOKENS",
    "AUDIO_TOWERS",
    "AudioSpec",
    "batch_sums",
    "call_sums",
    "clip_chunks",
    "clip_tokens",
    "halve",
]
