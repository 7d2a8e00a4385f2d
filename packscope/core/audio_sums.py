"""The audio sums the interval record carries: every audio tower's (packscope.core.audio:
Qwen3-Omni's; packscope.core.audio_gemma4: Gemma 4's), under one set of names, 0 where a tower
has no such sum (docs/flops.md, "Audio towers").

Pure Python, like the rest of ``packscope.core``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from packscope.core.audio import AUDIO_SUMS, AUDIO_TOWERS, AudioSpec
from packscope.core.audio_gemma4 import GEMMA4_AUDIO_SUMS, GEMMA4_AUDIO_TOWERS, Gemma4AudioSpec

# Each tower's sums, the names they share once: the record's audio fields, in this order.
AUDIO_RECORD_SUMS: tuple[str, ...] = tuple(dict.fromkeys((*AUDIO_SUMS, *GEMMA4_AUDIO_SUMS)))
AnyAudioSpec = AudioSpec | Gemma4AudioSpec


def audio_spec_from_dict(data: Any) -> AnyAudioSpec:
    """An audio tower's spec from its dict (``to_dict``), the class named by its ``tower``."""
    tower = data.get("tower") if isinstance(data, Mapping) else None
    if tower in AUDIO_TOWERS:
        return AudioSpec.from_dict(data)
    if tower in GEMMA4_AUDIO_TOWERS:
        return Gemma4AudioSpec.from_dict(data)
    raise ValueError(
        f"model field 'audio' must be an object whose 'tower' is one of "
        f"{', '.join((*AUDIO_TOWERS, *GEMMA4_AUDIO_TOWERS))}, got {tower!r}"
    )


def c_totals(audio: AnyAudioSpec) -> dict[str, int]:
    """FLOPs per unit of each record sum (its components added); a sum without work is left out."""
    out = {name: sum(parts.values()) for name, parts in audio.c_by_sum.items()}
    return {name: c for name, c in out.items() if c}


__all__ = ["AUDIO_RECORD_SUMS", "AnyAudioSpec", "audio_spec_from_dict", "c_totals"]
