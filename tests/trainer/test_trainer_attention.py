"""THD attention on CPU must equal causal attention run one document at a time."""

from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

from packscope.trainer.attention import (
    CausalAttention,
    DocumentMaskedAttention,
    VarlenAttention,
    attention_for,
)
from packscope.trainer.packing import pack_bshd, pack_thd


def oracle(q, k, v, bounds):
    """Causal attention of each span alone (k, v repeated for GQA), written into one stream."""
    out = torch.zeros_like(q)
    rep = q.shape[2] // k.shape[2]
    for a, b in itertools.pairwise(bounds):
        if b > a:
            qs, ks, vs = (t[0, a:b].transpose(0, 1) for t in (q, k, v))
            ks, vs = ks.repeat_interleave(rep, 0), vs.repeat_interleave(rep, 0)
            out[0, a:b] = F.scaled_dot_product_attention(qs, ks, vs, is_causal=True).transpose(0, 1)
    return out


def qkv(total, heads=4, kv_heads=2, dim=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, total, h, dim, generator=g) for h in (heads, kv_heads, kv_heads))


def test_block_causal_mask_matches_per_document_oracle():
    # Zero-length entries (repeated boundaries) must be harmless.
    bounds = [0, 7, 7, 20, 21, 40, 40, 40]
    q, k, v = qkv(40)
    got = DocumentMaskedAttention(torch.tensor(bounds, dtype=torch.int32), 40)(q, k, v)
    torch.testing.assert_close(got, oracle(q, k, v, bounds), rtol=1e-5, atol=1e-5)


def test_packed_batch_attention_matches_oracle_in_both_static_forms():
    docs = [torch.arange(1, n + 1) for n in (9, 30, 4, 17, 12, 2)]
    for static in (False, True):
        batch = pack_thd(docs, 32, n_packs=3, max_docs_per_pack=4, align=2, static=static)
        q, k, v = qkv(batch.tokens, seed=1)
        attention = attention_for(batch, torch.device("cpu"))
        assert isinstance(attention, DocumentMaskedAttention)
        expected = oracle(q, k, v, batch.cu_seqlens_padded.tolist())
        torch.testing.assert_close(attention(q, k, v), expected, rtol=1e-5, atol=1e-5)


def test_bshd_rows_are_causal_and_independent():
    batch = pack_bshd([torch.arange(1, 6), torch.arange(1, 9)], 8)
    attention = attention_for(batch, torch.device("cpu"))
    assert isinstance(attention, CausalAttention)
    q, k, v = (torch.randn(2, 8, h, 16) for h in (4, 2, 2))
    got = attention(q, k, v)
    for row in range(2):
        expected = oracle(q[row : row + 1], k[row : row + 1], v[row : row + 1], [0, 8])
        torch.testing.assert_close(got[row : row + 1], expected, rtol=1e-5, atol=1e-5)


def test_cuda_backend_is_varlen():
    batch = pack_thd([torch.arange(1, 6)], 8)
    attention = attention_for(batch, torch.device("cuda"))  # built lazily: no GPU needed to choose
    assert isinstance(attention, VarlenAttention) and attention.max_seqlen == 8


def windowed_oracle(q, k, v, bounds, window):
    """Each span alone, each query seeing itself and the window - 1 keys before it in its span."""
    out = torch.zeros_like(q)
    rep = q.shape[2] // k.shape[2]
    for a, b in itertools.pairwise(bounds):
        if b > a:
            qs, ks, vs = (t[0, a:b].transpose(0, 1) for t in (q, k, v))
            ks, vs = ks.repeat_interleave(rep, 0), vs.repeat_interleave(rep, 0)
            allowed = torch.tensor([[0 <= i - j < window for j in range(b - a)] for i in range(b - a)])
            out[0, a:b] = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=allowed).transpose(0, 1)
    return out


def test_sliding_window_attention_matches_the_per_document_oracle():
    """Documents shorter and longer than the window, in packs (THD) and as padded rows (BSHD)."""
    docs = [torch.arange(1, n + 1) for n in (9, 30, 4, 17, 12, 2)]
    batch = pack_thd(docs, 32, n_packs=3, max_docs_per_pack=4)
    q, k, v = qkv(batch.tokens, seed=2)
    attention = attention_for(batch, torch.device("cpu"), window=5)
    expected = windowed_oracle(q, k, v, batch.cu_seqlens_padded.tolist(), 5)
    torch.testing.assert_close(attention(q, k, v), expected, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(attention(q, k, v), attention_for(batch, torch.device("cpu"))(q, k, v))

    rows = pack_bshd([torch.arange(1, 6), torch.arange(1, 9)], 8)
    q, k, v = (torch.randn(2, 8, h, 16) for h in (4, 2, 2))
    got = attention_for(rows, torch.device("cpu"), window=3)(q, k, v)
    for row in range(2):
        expected = windowed_oracle(q[row : row + 1], k[row : row + 1], v[row : row + 1], [0, 8], 3)
        torch.testing.assert_close(got[row : row + 1], expected, rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
def test_varlen_sliding_window_matches_the_per_document_oracle_on_cuda():
    docs = [torch.arange(1, n + 1) for n in (90, 300, 40, 170)]
    batch = pack_thd(docs, 320, n_packs=2, max_docs_per_pack=4).to(torch.device("cuda"))
    q, k, v = (t.to("cuda", torch.bfloat16) for t in qkv(batch.tokens, heads=8, kv_heads=2, dim=64, seed=3))
    got = attention_for(batch, torch.device("cuda"), window=64)(q, k, v).float().cpu()
    bounds = batch.cu_seqlens_padded.tolist()
    expected = windowed_oracle(*(t.float().cpu() for t in (q, k, v)), bounds, 64)
    torch.testing.assert_close(got, expected, rtol=2e-2, atol=2e-2)
