"""A micro-batch's audio sums (packscope.core.audio), on the device and without a host sync.

Qwen3-Omni's thinker encodes a micro-batch's clips in one call of its audio tower, their mel-frame
counts given by ``feature_attention_mask`` ([clips, frames], 1 for a real frame) or
``audio_feature_lengths`` ([clips]). The sums follow from the counts by a handful of elementwise
kernels and two reductions (the longest chunk sets the padding and the attention window), whose
results stay on the device as 0-d int64 tensors: no ``.item()``, no data-dependent shape. The
reference, on host ints, is ``packscope.core.audio.call_sums``.

The interval record has no audio sums yet (docs/flops.md, "Audio towers"): these are what the
agent would add to it, and what the tests hold to the reference.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from packscope.core.audio import (
    AUDIO_CHUNKS,
    AUDIO_CLIPS,
    AUDIO_CONV_FRAMES,
    AUDIO_SQ_SUM,
    AUDIO_SUMS,
    AUDIO_TOKENS,
    FULL_CHUNK_TOKENS,
    AudioSpec,
)

# The batch keys a Qwen3-Omni processor writes for the audio tower, the mask first (transformers
# reads the lengths from it).
BATCH_KEYS = ("feature_attention_mask", "audio_feature_lengths")


def _halve(x: torch.Tensor) -> torch.Tensor:
    return torch.div(x - 1, 2, rounding_mode="floor") + 1


def frames_of(batch: Mapping[str, Any]) -> torch.Tensor | None:
    """Each clip's mel frames (int64, on the batch's device), or None for a batch without audio."""
    mask = batch.get("feature_attention_mask")
    if mask is not None:
        if not isinstance(mask, torch.Tensor) or mask.dim() != 2:
            raise ValueError(f"feature_attention_mask must be a [clips, frames] tensor, got {mask!r:.80}")
        return mask.to(torch.int64).sum(dim=1)
    lengths = batch.get("audio_feature_lengths")
    if lengths is None:
        return None
    if not isinstance(lengths, torch.Tensor) or lengths.dim() != 1:
        raise ValueError(f"audio_feature_lengths must be a [clips] tensor, got {lengths!r:.80}")
    if lengths.dtype.is_floating_point or lengths.dtype.is_complex or lengths.dtype == torch.bool:
        raise ValueError(f"audio_feature_lengths must hold integers, got {lengths.dtype}")
    return lengths.to(torch.int64)


def call_sums_on_device(audio: AudioSpec, frames: torch.Tensor) -> dict[str, torch.Tensor]:
    """The sums of one tower call on clips of ``frames`` mel frames (a clip of 0 frames is none)."""
    n = frames.clamp(min=0)
    full = torch.div(n, audio.chunk, rounding_mode="floor")
    tail = n - full * audio.chunk
    # every chunk is padded to the longest: a full one if any clip has one, else the longest tail
    longest = torch.where((full > 0).any(), torch.full_like(tail.max(), audio.chunk), tail.max())
    f1 = _halve(longest)
    f2 = _halve(f1)
    f3 = _halve(f2)
    chunks = (full + (tail > 0).to(torch.int64)).sum()
    tokens = full * FULL_CHUNK_TOKENS + _halve(_halve(_halve(tail)))  # g(0) = 0: no tail, no tokens
    window = (f3 * audio.windows_per_chunk).clamp(min=1)  # 0 only where there are no tokens
    whole = torch.div(tokens, window, rounding_mode="floor")
    rest = tokens - whole * window
    return {
        AUDIO_CLIPS: (n > 0).sum(),
        AUDIO_CHUNKS: chunks,
        AUDIO_CONV_FRAMES[0]: chunks * f1,
        AUDIO_CONV_FRAMES[1]: chunks * f2,
        AUDIO_CONV_FRAMES[2]: chunks * f3,
        AUDIO_TOKENS: tokens.sum(),
        AUDIO_SQ_SUM: (whole * window * window + rest * rest).sum(),
    }


def batch_audio_sums(audio: AudioSpec, batch: Mapping[str, Any]) -> dict[str, Any]:
    """The sums of one micro-batch (one call of the tower), from its processor's keys; zeros
    (host ints) for a batch without audio."""
    frames = frames_of(batch)
    if frames is None or frames.numel() == 0:
        return dict.fromkeys(AUDIO_SUMS, 0)
    return call_sums_on_device(audio, frames)


__all__ = ["BATCH_KEYS", "batch_audio_sums", "call_sums_on_device", "frames_of"]
