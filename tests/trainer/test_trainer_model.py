"""The model: RoPE restarts per document, and the FLOPs spec describes exactly this network."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from torch import nn

from packscope.trainer.attention import CausalAttention, attention_for
from packscope.trainer.config import PRESETS, ModelConfig
from packscope.trainer.model import Transformer
from packscope.trainer.packing import pack_thd


@pytest.fixture(scope="module")
def tiny():
    torch.manual_seed(0)
    return Transformer(PRESETS["tiny"]).eval()


def test_document_in_a_pack_equals_the_document_alone(tiny):
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(1, 512, (n,), generator=g) for n in (40, 7, 25, 60, 3)]
    batch = pack_thd(docs, 64, max_docs_per_pack=4, static=True)
    with torch.no_grad():
        packed = tiny(batch.input_ids, batch.position_ids, attention_for(batch, torch.device("cpu")))[0]
        for i, start in enumerate(batch.cu_seqlens_padded.tolist()[: len(docs)]):
            n = batch.doc_lengths[i]
            doc = batch.input_ids[:, start : start + n]
            alone = tiny(doc, torch.arange(n)[None], CausalAttention())[0]
            torch.testing.assert_close(packed[start : start + n], alone, rtol=1e-4, atol=1e-5)


def test_rope_reads_the_position_ids(tiny):
    """RoPE is relative: shifting every position changes nothing (to float error), stretching them
    does. So restarting positions per document is what a document alone would see, and the
    mask, not the positions, is what keeps documents apart (tested above and in the attention tests)."""
    ids = torch.randint(1, 512, (1, 16))
    pos = torch.arange(16)[None]
    with torch.no_grad():
        base = tiny(ids, pos, CausalAttention())
        shifted = tiny(ids, pos + 300, CausalAttention())
        stretched = tiny(ids, pos * 2, CausalAttention())
    torch.testing.assert_close(shifted, base, rtol=1e-4, atol=1e-4)
    assert not torch.allclose(stretched, base, atol=1e-3)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_model_spec_counts_exactly_this_network(name):
    cfg = PRESETS[name]
    with torch.device("meta"):
        model = Transformer(cfg)
    spec = cfg.to_model_spec()
    # Every GEMM weight (the tied head counts again: it is a second matmul) x 6 FLOPs per token.
    gemm = sum(m.weight.numel() for m in model.modules() if isinstance(m, nn.Linear))
    assert spec.padded_vocab == cfg.vocab
    assert spec.c_lin == 6 * gemm
    assert spec.c_core == 6 * cfg.layers * cfg.hidden
    assert spec.gated and spec.g == cfg.kv_heads


def test_fused_projections_compute_the_same_network(tiny):
    """The fused q/k/v and gate/up GEMMs, given the separate weights stacked, give the same logits
    and the same loss (so the FLOPs spec, counted per weight, holds for both)."""
    fused = Transformer(replace(PRESETS["tiny"], fused_projections=True)).eval()
    weights = dict(tiny.state_dict())
    for i in range(PRESETS["tiny"].layers):
        a, m = f"layers.{i}.attn.", f"layers.{i}.mlp."
        weights[a + "wqkv.weight"] = torch.cat([weights.pop(a + w + ".weight") for w in ("wq", "wk", "wv")])
        weights[m + "w13.weight"] = torch.cat([weights.pop(m + w + ".weight") for w in ("w1", "w3")])
    fused.load_state_dict(weights)  # strict: every parameter accounted for
    ids = torch.randint(1, 512, (2, 24), generator=torch.Generator().manual_seed(1))
    pos = torch.arange(24).expand(2, 24)
    labels = ids.roll(-1, dims=1)
    with torch.no_grad():
        torch.testing.assert_close(fused(ids, pos, CausalAttention()), tiny(ids, pos, CausalAttention()))
        for chunked in (False, True):
            (got, _), (want, _) = (m(ids, pos, CausalAttention(), labels, chunked) for m in (fused, tiny))
            torch.testing.assert_close(got, want)


def test_rope_table_equals_rope_computed(tiny):
    """The trainer's RoPE table (read by position) gives the same logits as computing cos/sin
    from the positions, for every position below the table's size."""
    tabled = Transformer(PRESETS["tiny"], max_positions=64).eval()
    tabled.load_state_dict(tiny.state_dict())
    ids = torch.randint(1, 512, (2, 64), generator=torch.Generator().manual_seed(2))
    pos = torch.arange(64).expand(2, 64)
    with torch.no_grad():
        torch.testing.assert_close(
            tabled(ids, pos, CausalAttention()), tiny(ids, pos, CausalAttention()), rtol=0, atol=0
        )


def test_preset_sizes():
    sizes = {}
    for name, cfg in PRESETS.items():
        with torch.device("meta"):
            sizes[name] = Transformer(cfg).num_params()
    assert sizes["tiny"] < 2e6
    assert 1.1e8 < sizes["small"] == sizes["125m"] < 1.4e8
    assert 0.8e9 < sizes["1b"] < 1.2e9


def test_bad_shapes_are_explained():
    with pytest.raises(ValueError, match="divisible by kv_heads"):
        ModelConfig(layers=1, hidden=64, heads=4, kv_heads=3, ffn=64, vocab=32)
    with pytest.raises(ValueError, match="unknown model preset"):
        ModelConfig.preset("7b")
