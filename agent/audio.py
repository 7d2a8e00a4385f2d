"""A micro-batch's audio sums (packscope.core.audio_sums), on the device and without a host sync.

Each audio tower reads its clips' lengths from a mask the feature extractor writes, [clips, T]
(Qwen3-Omni: ``feature_attention_mask``, or ``audio_feature_lengths`` [clips]; Gemma 4 and
Gemma 3n: ``input_features_mask``). The agent keeps the masks by reference and counts them at the log
boundary, all of the interval's calls together: the lengths are a row sum of each mask, and every
sum is elementwise in them and in a per-call maximum (``scatter_reduce``), so one kernel per call
and a fixed chain per interval (about 80 small ATen ops for Qwen3-Omni, 20 for Gemma 4, counted on
the CPU by tests/agent/test_deferred_forms.CountOps) whose results stay on the device give 0-d
int64 tensors, reduced with the interval's other device sums. No ``.item()``, ``.tolist()``,
boolean indexing or data-dependent shape is used; the per-clip call index travels by one pinned
non-blocking copy. What follows from the shapes alone (Gemma 4's clips, padded positions and
blocks; Gemma 3n's tokens too) is a host int.

The reference sums are ``packscope.core.audio.call_sums`` and ``packscope.core.audio_gemma4.call_sums``;
the device sums equal them on the same clips (tests/agent/test_audio_sums.py). A clip of 0 frames
(a mask row of zeros) counts as no clip of Qwen3-Omni's (its tower takes no chunk of it) and as a
padded row of Gemma 4's (its tower runs every row).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from packscope.agent.batch_forms import host_table
from packscope.core.audio import (
    AUDIO_CHUNKS,
    AUDIO_CLIPS,
    AUDIO_CONV_FRAMES,
    AUDIO_SQ_SUM,
    AUDIO_TOKENS,
    AudioSpec,
    halve3,
)
from packscope.core.audio_gemma4 import (
    AUDIO_BLOCKS,
    AUDIO_CALLS,
    AUDIO_CONV1_FRAMES,
    AUDIO_POSITIONS,
    Gemma4AudioSpec,
)
from packscope.core.audio_sums import AUDIO_RECORD_SUMS, AnyAudioSpec

# The batch keys each audio tower reads its clips from (HF processors' names), by the tower's name.
AUDIO_BATCH_KEYS: dict[str, tuple[str, ...]] = {
    "qwen3_omni": ("feature_attention_mask", "audio_feature_lengths"),
    "gemma4": ("input_features_mask",),
    "gemma3n": ("input_features_mask",),
}


def _g(x: torch.Tensor) -> torch.Tensor:
    """What a 3-wide, stride-2, padding-1 convolution leaves of x frames: (x - 1) // 2 + 1 (0 of 0)."""
    return torch.div(x - 1, 2, rounding_mode="floor") + 1


def _g3(x: torch.Tensor) -> torch.Tensor:
    return _g(_g(_g(x)))


def _check(key: str, value: torch.Tensor) -> None:
    """Shape and dtype only: both are known on the host."""
    dims = 1 if key == "audio_feature_lengths" else 2
    if value.dim() != dims:
        shape = "[clips]" if dims == 1 else "[clips, frames]"
        raise ValueError(f"{key} must be {shape}, got shape {tuple(value.shape)}")
    if value.dtype.is_floating_point or value.dtype.is_complex:
        raise ValueError(f"{key} must hold integers or booleans, got {value.dtype}")


def lengths_of(key: str, value: torch.Tensor) -> torch.Tensor:
    """A call's clip lengths in mel frames, int64 [clips], from a mask [clips, T] or lengths [clips]."""
    _check(key, value)
    n = value.to(torch.int64)
    return n if key == "audio_feature_lengths" else n.sum(dim=1)


def qwen3_omni_sums(audio: AudioSpec, calls: Sequence[torch.Tensor]) -> dict[str, Any]:
    """The sums of calls of Qwen3-Omni's tower, each its clips' lengths (int64 [clips], one device):
    0-d int64 device tensors, the clips a host int (``packscope.core.audio.call_sums`` is the reference)."""
    sizes = [int(c.shape[0]) for c in calls]
    out: dict[str, Any] = dict.fromkeys(AUDIO_RECORD_SUMS, 0)
    if not sum(sizes):
        return out
    n = torch.cat(list(calls)) if len(calls) > 1 else calls[0]
    device = n.device
    call_index = host_table([[i for i, size in enumerate(sizes) for _ in range(size)]], device)[0]
    chunk = audio.chunk
    full = torch.div(n, chunk, rounding_mode="floor")
    tail = n - full * chunk
    chunks = full + (tail > 0).to(torch.int64)
    # Every chunk of a call is padded to the call's longest: a full one if any clip has one, else the longest tail.
    longest_of_clip = torch.where(full > 0, torch.full_like(n, chunk), tail)
    longest = torch.zeros(len(calls), dtype=torch.int64, device=device)
    longest = longest.scatter_reduce(0, call_index, longest_of_clip, reduce="amax", include_self=True)
    k = torch.zeros(len(calls), dtype=torch.int64, device=device).index_add_(0, call_index, chunks)
    f1 = _g(longest)
    f2 = _g(f1)
    f3 = _g(f2)
    out[AUDIO_CLIPS] = (n > 0).sum()  # a clip of 0 frames is no clip the tower encodes
    out[AUDIO_CHUNKS] = k.sum()
    for name, frames in zip(AUDIO_CONV_FRAMES, (f1, f2, f3), strict=True):
        out[name] = (k * frames).sum()
    tokens = full * halve3(chunk) + _g3(tail)
    out[AUDIO_TOKENS] = tokens.sum()
    # Windows of g³(L) · (n_window_infer // chunk) tokens from each clip's start, the last shorter:
    # Σ w² = (t // w) · w² + (t mod w)² (attention.chunk_sq). A call without chunks has no tokens.
    window = torch.clamp(f3 * audio.windows_per_chunk, min=1)[call_index]
    whole = torch.div(tokens, window, rounding_mode="floor")
    rest = tokens - whole * window
    out[AUDIO_SQ_SUM] = (whole * window * window + rest * rest).sum()
    return out


def gemma4_sums(audio: Gemma4AudioSpec, calls: Sequence[tuple[torch.Tensor, int]]) -> dict[str, Any]:
    """The sums of calls of Gemma 4's or Gemma 3n's tower, each (its clips' lengths int64 [clips], the
    padded length T): host ints from the shapes, Gemma 4's tokens a 0-d int64 device tensor
    (``packscope.core.audio_gemma4.call_sums`` is the reference)."""
    out: dict[str, Any] = dict.fromkeys(AUDIO_RECORD_SUMS, 0)
    tokens: list[torch.Tensor] = []
    for lengths, padded in calls:
        clips = int(lengths.shape[0])
        if not clips:
            continue
        g1 = (padded - 1) // 2 + 1
        positions = (g1 - 1) // 2 + 1
        out[AUDIO_CLIPS] += clips
        out[AUDIO_CALLS] += 1
        out[AUDIO_CONV1_FRAMES] += clips * g1
        out[AUDIO_POSITIONS] += clips * positions
        out[AUDIO_BLOCKS] += clips * -(-positions // audio.chunk)
        if audio.tower == "gemma3n":  # the kept positions of every row, padding included: from the shape
            out[AUDIO_TOKENS] += clips * -(-positions // audio.reduction)
        else:
            tokens.append(lengths)
    if tokens:
        n = torch.cat(tokens) if len(tokens) > 1 else tokens[0]
        out[AUDIO_TOKENS] = _g(_g(n)).sum()
    return out


def call_of(audio: AnyAudioSpec, batch: Mapping[str, Any]) -> tuple[str, torch.Tensor] | None:
    """The key and tensor one micro-batch's clips come as (``AUDIO_BATCH_KEYS``, the first given), or
    None: no clips. Look-ups and shapes only (a host list becomes a CPU tensor)."""
    for key in AUDIO_BATCH_KEYS[audio.tower]:
        value = batch.get(key)
        if value is None:
            continue
        if not isinstance(value, torch.Tensor):
            value = torch.as_tensor(value)
        _check(key, value)
        return key, value
    return None


def _on(device: torch.device, t: torch.Tensor) -> torch.Tensor:
    """`t` on `device`; from the CPU to a GPU by a pinned non-blocking copy (a pageable one waits for the GPU)."""
    if t.device == device:
        return t
    if t.device.type == "cpu" and device.type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def interval_sums(
    audio: AnyAudioSpec, calls: Sequence[tuple[str, torch.Tensor]], device: torch.device
) -> dict[str, Any]:
    """The audio sums of an interval's calls (``call_of``'s), counted on ``device``."""
    lengths = [(_on(device, lengths_of(key, value)), value) for key, value in calls]
    if isinstance(audio, Gemma4AudioSpec):
        return gemma4_sums(audio, [(n, int(value.shape[1])) for n, value in lengths])
    return qwen3_omni_sums(audio, [n for n, _ in lengths])


__all__ = ["AUDIO_BATCH_KEYS", "call_of", "gemma4_sums", "interval_sums", "lengths_of", "qwen3_omni_sums"]
