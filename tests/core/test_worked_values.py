"""The worked values of docs/flops.md ("Worked values of 2026 architectures", "The published
configs"), recomputed from the published configs, so the page cannot drift from the code. The
code's numbers themselves are held to transformers by test_published_configs.py."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from packscope.core.attention import attention_sums
from packscope.core.flops import ModelSpec, packs_breakdown_by_kind
from packscope.core.hf_config import read_hf_config

ROOT = Path(__file__).parent.parent.parent
DOC = (ROOT / "docs" / "flops.md").read_text()
PUBLISHED = ROOT / "tests" / "fixtures" / "hf" / "published"
PACKS = [[9000, 4096, 2048, 1000], [12000, 4384]]
PACK_LENGTH = 16384


def table_rows(text: str) -> list[list[str]]:
    """The cells of a markdown table's lines (the header row first, the |---| line left out)."""
    return [
        [c.strip() for c in line.strip().strip("|").split("|")] for line in text.splitlines() if line.startswith("| ")
    ]


def by_kind(m: ModelSpec) -> str:
    return ", ".join(f"{kind} {value}" for kind, value in m.c_core_by_kind.items())


def no_window_term(m: ModelSpec, tokens: int, sums: dict[str, int]) -> int:
    """Every layer full attention over the whole pack: the Megatron formulas' attention term."""
    return tokens * m.c_lin + sums["seqlen_sq_sum_bshd"] * sum(m.c_core_by_kind.values())


WORKED = table_rows(DOC.split("<!-- worked-values:start -->")[1].split("<!-- worked-values:end -->")[0])[1:]


def test_the_worked_table_lists_the_six_models():
    assert [row[0] for row in WORKED] == [
        "Mistral-7B-v0.1",
        "Gemma-3-12B",
        "GPT-OSS-20B",
        "Llama-4-Scout-17B-16E",
        "DeepSeek-V3",
        "Qwen2.5-VL-7B (text)",
    ]


@pytest.mark.parametrize("row", WORKED, ids=lambda r: r[0])
def test_worked_values(row):
    _, fixture, c_lin, kinds, bshd, thd, useful, no_window = row
    m = read_hf_config(PUBLISHED / fixture.strip("`"))
    r = packs_breakdown_by_kind(m, PACKS, PACK_LENGTH)
    assert (r.tokens, r.real_tokens) == (32768, 32528)
    assert int(c_lin) == m.c_lin and kinds == by_kind(m)
    assert [bshd, thd, useful] == [f"{v:.6e}" for v in (r.flops_bshd, r.flops_thd, r.flops_useful)]
    assert no_window == f"{no_window_term(m, r.tokens, r.sums):.6e}"


def test_the_sums_and_percentages_in_the_text():
    text = " ".join(DOC.split())
    full = attention_sums(PACKS, PACK_LENGTH)
    assert f"`seqlen_sq_sum_thd` {full['seqlen_sq_sum_thd']}, `seqlen_sq_sum_bshd` {full['seqlen_sq_sum_bshd']}" in text
    for what, window in (("window 4096", 4096), ("window 1024", 1024), ("window 128", 128)):
        s = attention_sums(PACKS, PACK_LENGTH, window=window)
        assert f"{what}: {s['window_sq_sum_thd']} / {s['window_sq_sum_bshd']}" in text
    s = attention_sums(PACKS, PACK_LENGTH, chunk=8192)
    assert f"chunk 8192: {s['chunk_sq_sum_thd']} / {s['chunk_sq_sum_bshd']}" in text
    for model, fixture in (
        ("Mistral-7B-v0.1", "mistral_7b_v0_1.json"),
        ("Gemma-3-12B", "gemma3_12b.json"),
        ("GPT-OSS-20B", "gpt_oss_20b.json"),
        ("Llama-4-Scout", "llama4_scout_17b_16e.json"),
    ):
        m = read_hf_config(PUBLISHED / fixture)
        r = packs_breakdown_by_kind(m, PACKS, PACK_LENGTH)
        excess = 100 * (no_window_term(m, r.tokens, r.sums) / r.flops_thd - 1)
        assert no_window_term(m, r.tokens, r.sums) > r.flops_bshd
        assert f"{excess:.1f} % ({model}" in text


PUBLISHED_TABLE = table_rows(DOC.split("## The published configs")[1].split("### Where")[0])[1:]


@pytest.mark.parametrize("row", PUBLISHED_TABLE, ids=lambda r: r[0])
def test_published_config_table(row):
    fixtures, layers, size, c_lin, kinds = row
    for fixture in re.findall(r"`([^`]+)`", fixtures):
        m = read_hf_config(PUBLISHED / fixture)
        decoder = m.kinds[: m.layers]
        expected = ", ".join(
            f"{k} {decoder.count(k)}" for k in ("full", "sliding", "chunked", "linear") if k in decoder
        )
        assert layers == expected + (f" + {m.mtp_depth} MTP" if m.mtp_depth else "")
        assert size == (f"W {m.window}" if m.window else f"C {m.chunk}" if m.chunk else "—")
        assert (int(c_lin), kinds) == (m.c_lin, by_kind(m))


def test_the_published_table_covers_every_fixture():
    listed = {f for row in PUBLISHED_TABLE for f in re.findall(r"`([^`]+)`", row[0])}
    assert listed == {p.name for p in PUBLISHED.glob("*.json")}


def test_the_megatron_mla_note():
    m = read_hf_config(PUBLISHED / "deepseek_v3.json")
    assert m.mla is not None and m.mla.q_lora_rank is not None
    per_layer = 6 * (m.mla.q_lora_rank + m.mla.kv_lora_rank)
    assert f"6 · {m.mla.q_lora_rank + m.mla.kv_lora_rank} = {per_layer} FLOPs" in " ".join(DOC.split())
    share = f"{per_layer * m.total_layers / m.c_lin:.1e}".replace("e-0", "e-")  # 3.3e-6
    assert f"{share} of its C_lin" in " ".join(DOC.split())
