"""The worked values of docs/flops.md's "The structural count", recomputed, so the page cannot drift
from the code. The structural count itself is held to torch's own counts and transformers' masks by
test_hf_structure.py."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from packscope.agent.hf_structure import spec_from_structure
from packscope.core.flops import ModelSpec, packs_breakdown_by_kind
from packscope.core.vision import batch_sums, decoder_tokens, fixed_image_sums, padded_rows_sums
from tests.core.test_worked_values import table_rows

ROOT = Path(__file__).parent.parent.parent
DOC = (ROOT / "docs" / "flops.md").read_text()
FIXTURES = ROOT / "tests" / "fixtures" / "hf" / "structural"
PACK = [[4096, 2048, 1024, 512, 256, 256]]
SLOTS = 8192
MODELS = {
    "qwen3_5_text.json": "Qwen3.5 (dense)",
    "qwen3_5_moe_text.json": "Qwen3.5 (MoE)",
    "glm4_moe.json": "GLM-4.5",
    "deepseek_v32.json": "DeepSeek-V3.2",
    "olmo3.json": "OLMo-3",
    "falcon_h1.json": "Falcon-H1 (hybrid)",
    "gemma3n_text.json": "Gemma 3n",
    "gemma4_text.json": "Gemma 4",
}
HEADER = (
    "| model | fixture | layers by kind | window | c_lin | c_core by kind | flops_bshd | flops_thd | over-count |\n"
    "|---|---|---|---|---|---|---|---|---|"
)


def spec(fixture: str) -> ModelSpec:
    return spec_from_structure(json.loads((FIXTURES / fixture).read_text()))


def row(fixture: str) -> str:
    """One line of the table, from the code."""
    m = spec(fixture)
    b = packs_breakdown_by_kind(m, PACK, SLOTS)
    kinds = ", ".join(f"{kind} {n}" for kind, n in Counter(m.kinds[: m.layers]).items())
    kinds += f" + {m.mtp_depth} MTP" if m.mtp_depth else ""
    core = ", ".join(f"{kind} {value}" for kind, value in m.c_core_by_kind.items())
    over = 100 * (b.flops_bshd - b.flops_thd) / b.flops_thd
    return (
        f"| {MODELS[fixture]} | `{fixture}` | {kinds} | {m.window or '—'} | {m.c_lin} | {core} "
        f"| {b.flops_bshd:.6e} | {b.flops_thd:.6e} | {over:.2f} % |"
    )


def documented() -> str:
    return DOC.split("<!-- structural-values:start -->\n")[1].split("<!-- structural-values:end -->")[0]


def test_the_table_has_one_row_per_model():
    rows = table_rows(documented())[1:]
    assert [r[1].strip("`") for r in rows] == list(MODELS)


@pytest.mark.parametrize("fixture", MODELS)
def test_structural_worked_values(fixture):
    lines = {line.split("|")[2].strip(): line for line in documented().splitlines() if line.startswith("| ")}
    assert lines[f"`{fixture}`"] == row(fixture)


def test_the_documented_pack_is_the_one_computed():
    m = spec("olmo3.json")
    b = packs_breakdown_by_kind(m, PACK, SLOTS)
    # Independent of the table: the window sum of the documents by hand (W = 4096; none is longer).
    assert m.window == 4096
    assert b.sums["window_sq_sum_thd"] == sum(s * s for s in PACK[0])
    assert b.sums["window_sq_sum_bshd"] == 2 * SLOTS * 4096 - 4096 * 4096


# The wrappers' towers (packscope.agent.hf_towers): a 448 x 640 px image and an 8-frame 320 x 576 px
# video (temporal patch 2), as image_grid_thw gives them; InternVL three 448 x 448 px tiles.
WRAPPERS = {
    "qwen3_vl.json": "Qwen3-VL",
    "qwen3_5.json": "Qwen3.5 (dense)",
    "internvl.json": "InternVL",
    "gemma4.json": "Gemma 4",
}
IMAGES = [(1, 28, 40), (4, 20, 36)]
TILES = 3
# Gemma 4: a 768 x 1024 px and an 896 x 896 px image as its processor resizes them for the default
# max_soft_tokens 280 (672 x 912 and 768 x 768 px: 42 x 57 and 48 x 48 patches of 16 px, sides in
# multiples of 3 patches), each padded to 280 · 3² = 2520 slots.
GEMMA4_IMAGES, GEMMA4_SLOTS = [(42, 57), (48, 48)], 2520
TOWER_HEADER = (
    "| model | fixture | vision_patches | vision_sq_sum | decoder tokens | c_lin | C_full | patch_embedding "
    "| attention | mlp | projector | core_full | FLOPs_vision |\n" + "|---" * 13 + "|"
)


def tower_row(fixture: str) -> str:
    vision = spec(fixture).vision
    assert vision is not None
    real = None
    if vision.tower == "gemma4":
        sums = padded_rows_sums(vision, GEMMA4_IMAGES, GEMMA4_SLOTS)
        real = sum(h * w for h, w in GEMMA4_IMAGES)
    else:
        sums = batch_sums(vision, IMAGES) if vision.image_grid is None else fixed_image_sums(vision, TILES)
    parts = vision.flops_by_component(sums)
    split = " | ".join(f"{parts[k]:.6e}" for k in ("patch_embedding", "attention", "mlp", "projector", "core_full"))
    return (
        f"| {WRAPPERS[fixture]} | `{fixture}` | {sums['vision_patches']} | {sums['vision_sq_sum']} "
        f"| {decoder_tokens(vision, sums, real)} | {vision.c_lin} | {vision.c_core_by_kind['full']} | {split} "
        f"| {vision.flops(sums):.6e} |"
    )


def documented_towers() -> str:
    return DOC.split("<!-- structural-towers:start -->\n")[1].split("<!-- structural-towers:end -->")[0]


@pytest.mark.parametrize("fixture", WRAPPERS)
def test_structural_tower_worked_values(fixture):
    lines = {line.split("|")[2].strip(): line for line in documented_towers().splitlines() if line.startswith("| ")}
    assert lines[f"`{fixture}`"] == tower_row(fixture)


def test_the_tower_table_has_one_row_per_wrapper_and_the_documented_images():
    assert [r[1].strip("`") for r in table_rows(documented_towers())[1:]] == list(WRAPPERS)
    # Independent of the table: the images' patches and per-frame squares by hand.
    assert batch_sums(spec("qwen3_5.json").vision, IMAGES)["vision_sq_sum"] == (28 * 40) ** 2 + 4 * (20 * 36) ** 2
    # The decoders the page names beside the table.
    for fixture in ("qwen3_vl.json", "internvl.json"):
        assert spec(fixture).c_lin == 68561141760 and spec(fixture).kinds == ("full",) * 32
    assert spec("qwen3_5.json").c_lin_by_component == spec("qwen3_5_text.json").c_lin_by_component
    tiles = fixed_image_sums(spec("internvl.json").vision, TILES)  # 32 x 32 patches and a class token each
    assert (tiles["vision_patches"], tiles["vision_sq_sum"]) == (3 * 32 * 32, 3 * (32 * 32 + 1) ** 2)
    # Gemma 4: every slot through the GEMMs, every slot's query against its image's real patches
    rows = padded_rows_sums(spec("gemma4.json").vision, GEMMA4_IMAGES, GEMMA4_SLOTS)
    assert (rows["vision_patches"], rows["vision_sq_sum"]) == (2 * 2520, 2520 * (42 * 57 + 48 * 48))
    assert spec("gemma4.json").c_lin_by_component == spec("gemma4_text.json").c_lin_by_component


if __name__ == "__main__":  # print the tables for the doc
    print(HEADER)
    for name in MODELS:
        print(row(name))
    print(TOWER_HEADER)
    for name in WRAPPERS:
        print(tower_row(name))


def test_gemma3n_by_hand():
    """docs/flops.md's Gemma 3n paragraph: each of its own components from the fixture's sizes by
    hand, against the structural count, and the figures the page prints."""
    cfg = json.loads((FIXTURES / "gemma3n_text.json").read_text())
    h, layers, shared = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["num_kv_shared_layers"]
    n, r, p = cfg["altup_num_inputs"], cfg["laurel_rank"], cfg["hidden_size_per_layer_input"]
    q, kv = cfg["num_attention_heads"] * cfg["head_dim"], cfg["num_key_value_heads"] * cfg["head_dim"]
    by_hand = {
        "altup": 6 * (layers * (2 * h * n + n**3 + n**2 + h * n * n) + 2 * (n - 1) * h * h),
        "laurel": 6 * layers * 2 * h * r,
        "per_layer_inputs": 6 * (h * layers * p + layers * 2 * h * p),
        "attention": 6 * ((layers - shared) * (2 * h * q + 2 * h * kv) + shared * 2 * h * q),
    }
    measured = spec("gemma3n_text.json").c_lin_by_component
    section = DOC.split('<a id="gemma-3n-worked"></a>')[1].split("\n\n## ")[0]
    for key, value in by_hand.items():
        assert measured[key] == value, key
        assert f"= {value}" in " ".join(section.split()), key
    # the command's output, as the page quotes it
    m = spec("gemma3n_text.json")
    b = packs_breakdown_by_kind(m, PACK, SLOTS)
    quoted = ", ".join(f"{k} {v}" for k, v in measured.items() if v)
    assert f"# c_lin {m.c_lin}: " in section and f"flops_thd {b.flops_thd}" in section
    assert quoted in " ".join(line.strip("# ") for line in section.splitlines() if line.strip().startswith("#"))
