"""The independent check on tiny random configs, one per supported architecture.

The expected numbers come from what transformers builds and masks (tests/core/hf_meta.py), never
from packscope's formula: the GEMM work per token read off the module shapes on the meta device,
the attention coefficient from each attention module's head widths, and the attention pairs that
the mask each layer receives in a real CPU forward pass over packed rows lets through.
"""

from __future__ import annotations

import functools

import pytest

pytest.importorskip("transformers")

from packscope.core.attention import ATTENTION_SUMS, CHUNKED, FULL, LINEAR, SLIDING, attention_sums
from packscope.core.flops import ModelSpec
from packscope.core.hf_config import spec_from_hf_dict
from tests.core import hf_meta as hf
from tests.core.tiny_configs import PACKS, TINY

HF_KIND = {
    "full_attention": FULL,
    "sliding_attention": SLIDING,
    "chunked_attention": CHUNKED,
    "linear_attention": LINEAR,
}
# The Llama 4 wrapper's text-only forward fails inside transformers 5.24 ('MoeCausalLMOutputWithPast'
# has no 'image_outputs'); its decoder is llama4_text, which runs.
NO_FORWARD = {"llama4"}
# transformers 5.24's GptOssModel builds its masks without position_ids, so packed rows are not
# split into documents under sdpa/eager: every layer attends across the whole row.
ROW_NOT_SPLIT = {"gpt_oss"}


@functools.cache
def spec(name: str) -> ModelSpec:
    return spec_from_hf_dict(TINY[name])


@functools.cache
def meta_model(name: str):
    return hf.build(hf.config_from_dict(TINY[name]))


@functools.cache
def cpu_model(name: str):
    import torch

    torch.manual_seed(0)
    config = hf.config_from_dict(TINY[name])
    config._attn_implementation = hf.COUNT
    config.get_text_config()._attn_implementation = hf.COUNT
    return hf.build(config, "cpu").eval()


@pytest.mark.parametrize("name", sorted(TINY))
def test_linear_work_per_token_is_the_module_shapes(name):
    m = spec(name)
    model = meta_model(name)
    mtp = hf.build_mtp(model, m.mtp_depth) if m.mtp_depth else None
    from_modules = hf.gemm_components(model, mtp)
    if m.mtp_depth:
        # A term no module holds: Megatron's 3h per MTP layer for its norms (docs/flops.md).
        from_modules["mtp"] += 6 * 3 * m.hidden * m.mtp_depth
    if m.linear_attention is not None:
        # The other one: the delta-rule state update, 4 · value heads · d_v² per token (Megatron-LM).
        la = m.linear_attention
        from_modules["linear_attention_state"] = (
            6 * m.kinds.count(LINEAR) * 4 * la.num_value_heads * la.value_head_dim**2
        )
    assert {k: v for k, v in m.c_lin_by_component.items() if v} == from_modules


@pytest.mark.parametrize("name", sorted(TINY))
def test_layer_kinds_and_attention_coefficients_are_the_modules(name):
    m = spec(name)
    model = meta_model(name)
    kinds = [HF_KIND[k] for k in hf.transformers_layer_kinds(model)]
    assert list(m.kinds[: m.layers]) == kinds
    expected: dict[str, int] = {}
    for i, kind in enumerate(kinds + [kinds[-1]] * m.mtp_depth):  # MTP layers repeat the last layer
        if kind != LINEAR:
            layer = min(i, m.layers - 1)
            expected[kind] = expected.get(kind, 0) + 3 * hf.core_macs_per_pair(model, layer)
    assert m.c_core_by_kind == expected
    text = model.config.get_text_config()
    assert m.window == (text.sliding_window if SLIDING in kinds else None)
    assert m.chunk == (getattr(text, "attention_chunk_size", None) if CHUNKED in kinds else None)


def exact_pairs_relation(kind: str, docs: list[int], window: int | None) -> int:
    """What 2·pairs exceeds the s²/2-convention sum by (docs/flops.md, "Exact pairs")."""
    if kind == SLIDING:
        assert window is not None
        return sum(min(s, window) for s in docs)
    return sum(docs)


@pytest.mark.parametrize("docs", [*PACKS, [16]], ids=str)
@pytest.mark.parametrize("name", sorted(set(TINY) - NO_FORWARD))
def test_pairs_each_layer_attends_in_a_forward_pass(name, docs):
    m = spec(name)
    pairs = hf.count_pairs_in_forward(cpu_model(name), docs)
    # A row the model does not split into documents is attended like one sequence (the BSHD view).
    attended = [sum(docs)] if name in ROW_NOT_SPLIT else docs
    sums = attention_sums([attended], window=m.window, chunk=m.chunk)
    for layer, kind in enumerate(m.kinds[: m.layers]):
        if kind == LINEAR:
            assert layer not in pairs, "a linear-attention layer has no attention mask"
            continue
        assert 2 * pairs[layer] == sums[ATTENTION_SUMS[kind].thd] + exact_pairs_relation(kind, attended, m.window)
    assert sorted(pairs) == [i for i, k in enumerate(m.kinds[: m.layers]) if k != LINEAR]


@pytest.mark.parametrize("docs", PACKS, ids=str)
def test_gpt_oss_masks_split_documents_when_given_positions(docs):
    """The per-document sums hold for GPT-OSS's own mask builders once they get the positions
    (what a packed trainer's varlen or flex attention does)."""
    m = spec("gpt_oss")
    config = hf.config_from_dict(TINY["gpt_oss"])
    sums = attention_sums([docs], window=m.window)
    for hf_kind, kind in (("full_attention", FULL), ("sliding_attention", SLIDING)):
        pairs = hf.mask_pairs(config, hf_kind, docs)
        assert 2 * pairs == sums[ATTENTION_SUMS[kind].thd] + exact_pairs_relation(kind, docs, m.window)


def test_the_gpt_oss_row_is_really_not_split():
    """Guard for ROW_NOT_SPLIT: if transformers starts splitting GPT-OSS rows, this fails and the
    exception above must go."""
    docs = [3, 9, 4]
    full_layer = spec("gpt_oss").kinds.index(FULL)
    pairs = hf.count_pairs_in_forward(cpu_model("gpt_oss"), docs)
    assert pairs[full_layer] == 16 * 17 // 2 != sum(s * (s + 1) // 2 for s in docs)


@pytest.mark.parametrize("name", sorted(TINY))
def test_a_loaded_transformers_config_reads_as_its_dict(name):
    """What an integration hands over (``model.config``, after transformers' own defaults and
    derivations) reads to the same model as the config dict."""
    from packscope.core.hf_config import spec_from_hf_config

    assert spec_from_hf_config(hf.config_from_dict(TINY[name])) == spec(name)
