"""The published config.json of the vision-language models whose towers packscope counts: three of
the fourteen in tests/fixtures/hf/published/ and two in its vision/ folder (the README there says
where each comes from)."""

from __future__ import annotations

from pathlib import Path

PUBLISHED = Path(__file__).parent.parent / "fixtures" / "hf" / "published"
PUBLISHED_VISION = {
    name: PUBLISHED / name
    for name in (
        "qwen2_5_vl_7b.json",
        "gemma3_12b.json",
        "llama4_scout_17b_16e.json",
        "vision/mistral_small_3_1_24b.json",
        "vision/llava_1_5_7b.json",
    )
}
