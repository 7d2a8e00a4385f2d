"""THD attention on CPU must equal causal attention run one document at a time."""

from __future__ import annotations

import itertools

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
