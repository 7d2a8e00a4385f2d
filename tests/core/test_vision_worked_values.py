"""The worked values of docs/flops.md's "Vision towers", recomputed, so the page cannot drift from
the code. The code's numbers themselves are held to transformers' towers by
test_vision_independent.py."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from packscope.commands.cli import main
from packscope.core.flops import packs_breakdown_by_kind
from packscope.core.hf_config import read_hf_config
from packscope.core.vision import VisionSpec, batch_sums, decoder_tokens, fixed_image_sums
from tests.core.test_worked_values import table_rows

ROOT = Path(__file__).parent.parent.parent
DOC = (ROOT / "docs" / "flops.md").read_text()
PUBLISHED = ROOT / "tests" / "fixtures" / "hf" / "published"
QWEN_IMAGES = [(1, 32, 46), (1, 74, 98), (4, 26, 46)]  # 448 x 644 px, 1036 x 1372 px, 8 frames of 364 x 644 px
GEMMA_IMAGES = 3
PACKS = [[900, 1400, 2100, 768, 1500, 1200], [3000, 2500, 1700]]
PACK_IMAGES = [(1, 32, 46)] * 9  # one 448 x 644 px image per sample


def between(marker: str) -> list[list[str]]:
    return table_rows(DOC.split(f"<!-- {marker}:start -->")[1].split(f"<!-- {marker}:end -->")[0])[1:]


def tower(fixture: str) -> VisionSpec:
    vision = read_hf_config(PUBLISHED / fixture).vision
    assert vision is not None
    return vision


def documented_sums(vision: VisionSpec) -> dict[str, int]:
    return batch_sums(vision, QWEN_IMAGES) if vision.tower == "qwen2_5_vl" else fixed_image_sums(vision, GEMMA_IMAGES)


def test_the_pixel_sizes_in_the_text_are_the_grids():
    qwen = tower("qwen2_5_vl_7b.json")
    p = qwen.patch_size
    assert [(1, 448 // p, 644 // p), (1, 1036 // p, 1372 // p), (8 // 2, 364 // p, 644 // p)] == QWEN_IMAGES
    assert tower("gemma3_12b.json").image_grid == (896 // 14, 896 // 14)


@pytest.mark.parametrize("row", between("vision-values"), ids=lambda r: r[0])
def test_vision_worked_values(row):
    _, fixture, images, patches, sq, window_sq, tokens, c_lin, cores, total = row
    vision = tower(fixture.strip("`"))
    sums = documented_sums(vision)
    assert [int(images), int(patches), int(sq), int(window_sq)] == [
        sums["vision_images"],
        sums["vision_patches"],
        sums["vision_sq_sum"],
        sums["vision_window_sq_sum"],
    ]
    assert int(tokens) == decoder_tokens(vision, sums) and int(c_lin) == vision.c_lin
    core = vision.c_core_by_kind
    assert cores == f"{core.get('full', 0)}, {core.get('window', 0)}"
    assert total == f"{vision.flops(sums):.6e}"


@pytest.mark.parametrize("row", between("vision-components"), ids=lambda r: r[0])
def test_vision_components(row):
    fixture = {"Qwen2.5-VL-7B": "qwen2_5_vl_7b.json", "Gemma-3-12B": "gemma3_12b.json"}[row[0]]
    vision = tower(fixture)
    by_component = vision.flops_by_component(documented_sums(vision))
    assert row[1:] == [f"{value:.6e}" for value in by_component.values()]


def test_the_packing_table():
    model = read_hf_config(PUBLISHED / "qwen2_5_vl_7b.json")
    assert model.vision is not None
    decoder = packs_breakdown_by_kind(model, PACKS, 8192)
    sums = batch_sums(model.vision, PACK_IMAGES)
    vision = model.vision.flops(sums)
    rows = between("vision-packing")
    plain = [decoder.flops_bshd, decoder.flops_thd, decoder.flops_useful]
    assert rows[0][1:] == [*(f"{v:.6e}" for v in plain), f"{100 * (plain[0] / plain[1] - 1):.2f} %"]
    both = [v + vision for v in plain]
    assert rows[1][1:] == [*(f"{v:.6e}" for v in both), f"{100 * (both[0] / both[1] - 1):.2f} %"]
    assert f"vision_sq_sum {sums['vision_sq_sum']}, vision_window_sq_sum {sums['vision_window_sq_sum']}" in rows[1][0]
    assert f"{vision:.6e} FLOPs" in rows[1][0] and "9 images" in rows[1][0]


def bridge_vit_flops(vision: VisionSpec, patches: int, samples: int) -> float:
    """Megatron-Bridge's ViT term as docs/flops.md describes it (patches per sample, every block full
    attention, a two-matrix MLP, the merger, no patch embedding), written out here to check the
    page's figure; packscope does not use it."""
    h, ffn, m = vision.hidden, vision.ffn, vision.spatial_merge
    per_sample = patches / samples
    per_token = 8 * h * h + 4 * h * per_sample + 4 * h * ffn
    merged_in, merged_out = vision.projector[1]
    merger = (per_sample // (m * m)) * (2 * merged_in * merged_in + 2 * merged_in * merged_out)
    return (per_token * per_sample * vision.layers + merger) * samples * 3


def test_the_bridge_comparison():
    vision = tower("qwen2_5_vl_7b.json")
    sums = batch_sums(vision, QWEN_IMAGES)
    theirs, ours = bridge_vit_flops(vision, sums["vision_patches"], 3), vision.flops(sums)
    text = " ".join(DOC.split())
    assert f"gives {theirs:.6e} FLOPs, {100 * (theirs / ours - 1):.1f} % above packscope's {ours:.6e}" in text


def documented_commands() -> list[list[str]]:
    """The section's `packscope flops` command lines (continuations joined), as argument lists."""
    section = DOC.split("## Vision towers")[1].split("### Packing")[0].replace("\\\n", " ")
    return [
        shlex.split(line.strip())[1:] for line in section.splitlines() if line.strip().startswith("packscope flops")
    ]


def test_the_documented_commands(capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    commands = documented_commands()
    assert len(commands) == 2
    for args in commands:
        assert main(args) == 0
        out = json.loads(capsys.readouterr().out)
        vision = tower(Path(args[args.index("--hf-config") + 1]).name)
        sums = documented_sums(vision)
        assert out["vision"]["sums"] == sums and out["vision"]["flops"] == vision.flops(sums)
        assert int(args[args.index("--pack") + 1]) == decoder_tokens(vision, sums)  # one pack of the images' tokens
