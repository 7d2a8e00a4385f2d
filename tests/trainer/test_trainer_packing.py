"""Packing invariants: every document token exactly once, boundaries consistent with positions,
labels never cross a document, and the static form's fixed size and dummy tail."""

from __future__ import annotations

import itertools

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from packscope.trainer.packing import IGNORE, first_fit_decreasing, pack_bshd, pack_thd


def unique_docs(lengths: list[int]) -> list[torch.Tensor]:
    """Documents whose tokens are all distinct, so every token can be traced back."""
    docs, start = [], 1
    for n in lengths:
        docs.append(torch.arange(start, start + n))
        start += n
    return docs


def spans(bounds: list[int]) -> list[tuple[int, int]]:
    return [(a, b) for a, b in itertools.pairwise(bounds) if b > a]


def check_thd(docs: list[torch.Tensor], batch, max_docs: int, align: int) -> None:
    total = batch.n_packs * batch.pack_length
    ids, pos, labels = batch.input_ids[0], batch.position_ids[0], batch.labels[0]
    cu, cu_pad = batch.cu_seqlens.tolist(), batch.cu_seqlens_padded.tolist()
    n = len(batch.doc_lengths)
    assert batch.input_ids.shape == batch.position_ids.shape == batch.labels.shape == (1, total)
    assert batch.cu_seqlens.dtype == batch.cu_seqlens_padded.dtype == torch.int32
    assert len(cu) == len(cu_pad)
    assert [b - a for a, b in itertools.pairwise(cu)][:n] == batch.doc_lengths
    assert sorted(batch.doc_lengths) == sorted(len(d) for d in docs)

    # Every document token appears exactly once, at the start of its span.
    by_first = {int(d[0]): d for d in docs}
    seen = []
    for i in range(n):
        start, length = cu_pad[i], batch.doc_lengths[i]
        doc = by_first[int(ids[start])]
        assert torch.equal(ids[start : start + length], doc)
        assert torch.equal(labels[start : start + length - 1], doc[1:])
        assert labels[start + length - 1] == IGNORE  # no prediction across documents
        assert start % batch.pack_length + -(-length // align) * align <= batch.pack_length
        seen.append(ids[start : start + length])
    real = torch.cat(seen)
    assert torch.equal(real.sort().values, torch.cat(docs).sort().values)
    assert int((labels != IGNORE).sum()) == batch.label_tokens == sum(batch.doc_lengths) - n
    assert int((ids != 0).sum()) == batch.real_tokens  # padding holds token 0, documents never do
    assert torch.equal(batch.token_mask[0], ids != 0)

    # Spans tile the stream; positions restart at 0 at every span and count up inside it.
    covered = spans(cu_pad)
    assert covered[0][0] == 0 and covered[-1][1] == total
    assert all(a[1] == b[0] for a, b in itertools.pairwise(covered))
    starts = torch.zeros(total, dtype=torch.bool)
    for a, b in covered:
        assert torch.equal(pos[a:b], torch.arange(b - a))
        starts[a] = True
    assert torch.equal(pos == 0, starts)
    assert batch.max_seqlen >= max(b - a for a, b in covered)
    # Documents stay inside their pack.
    for i in range(n):
        assert cu_pad[i] // batch.pack_length == (cu_pad[i] + batch.doc_lengths[i] - 1) // batch.pack_length
    assert all(len([s for s in cu_pad[:n] if s // batch.pack_length == p]) <= max_docs for p in range(batch.n_packs))


lengths_st = st.lists(st.integers(1, 64), min_size=1, max_size=24)


@settings(max_examples=60, deadline=None)
@given(lengths=lengths_st, max_docs=st.integers(1, 8), align=st.sampled_from([1, 4, 8]), static=st.booleans())
def test_thd_packing_invariants(lengths, max_docs, align, static):
    docs = unique_docs(lengths)
    batch = pack_thd(docs, 64, max_docs_per_pack=max_docs, align=align, static=static)
    check_thd(docs, batch, max_docs, align)
    total = batch.tokens
    cu, cu_pad = batch.cu_seqlens.tolist(), batch.cu_seqlens_padded.tolist()
    n = len(docs)
    if static:
        assert len(cu) == batch.n_packs * max_docs + 2
        assert batch.max_seqlen == 64
        tail = total - cu_pad[n]
        assert batch.dummy_tail == (tail > 0)
        assert cu_pad[n + 1 :] == [total] * (len(cu) - n - 1)
        assert cu[n + 1 :] == [cu[n] + tail] * (len(cu) - n - 1)
    else:
        assert len(cu) == n + 1 and cu_pad[-1] == total and cu[-1] == batch.real_tokens
        assert not batch.dummy_tail


def test_ffd_places_every_document_once_within_limits():
    lengths = [50, 10, 40, 30, 30, 20, 5, 64, 1, 33]
    packs = first_fit_decreasing(lengths, 64, max_docs=3, align=4)
    assert sorted(i for p in packs for i in p) == list(range(len(lengths)))
    for pack in packs:
        assert len(pack) <= 3
        assert sum(-(-lengths[i] // 4) * 4 for i in pack) <= 64
    assert packs[0] == [7]  # longest first
    with pytest.raises(ValueError, match="more than the pack length"):
        first_fit_decreasing([65], 64, max_docs=4)


def test_thd_static_form_by_hand():
    docs = unique_docs([5, 3, 6])
    batch = pack_thd(docs, 8, n_packs=2, max_docs_per_pack=2, static=True)
    # FFD: pack 0 = [6] (2 spare), pack 1 = [5, 3] (full). The 6-token document absorbs its
    # pack's padding; the final pack is full, so the tail is empty and the last boundary repeats.
    assert batch.doc_lengths == [6, 5, 3]
    assert batch.cu_seqlens.tolist() == [0, 6, 11, 14, 14, 14]
    assert batch.cu_seqlens_padded.tolist() == [0, 8, 13, 16, 16, 16]
    assert not batch.dummy_tail
    assert batch.position_ids[0].tolist() == [0, 1, 2, 3, 4, 5, 6, 7, 0, 1, 2, 3, 4, 0, 1, 2]

    batch = pack_thd(unique_docs([5, 6]), 8, n_packs=2, max_docs_per_pack=2, static=True)
    # The final pack's 3 spare slots become the dummy tail.
    assert batch.cu_seqlens_padded.tolist() == [0, 8, 13, 16, 16, 16]
    assert batch.cu_seqlens.tolist() == [0, 6, 11, 14, 14, 14]
    assert batch.dummy_tail and batch.max_seqlen == 8
    assert batch.position_ids[0, 8:].tolist() == [0, 1, 2, 3, 4, 0, 1, 2]


def test_thd_rejects_too_few_packs():
    with pytest.raises(ValueError, match="need 2 packs"):
        pack_thd(unique_docs([6, 6]), 8, n_packs=1)


@settings(max_examples=30, deadline=None)
@given(lengths=lengths_st)
def test_bshd_one_document_per_padded_row(lengths):
    docs = unique_docs(lengths)
    batch = pack_bshd(docs, 64)
    assert batch.input_ids.shape == batch.attention_mask.shape == (len(docs), 64)
    assert batch.attention_mask.sum(1).tolist() == lengths
    for r, doc in enumerate(docs):
        n = len(doc)
        assert torch.equal(batch.input_ids[r, :n], doc)
        assert torch.equal(batch.labels[r, : n - 1], doc[1:])
        assert (batch.labels[r, n - 1 :] == IGNORE).all()
        assert (batch.input_ids[r, n:] == 0).all()
    assert torch.equal(batch.position_ids, torch.arange(64).expand(len(docs), 64))
    assert batch.label_tokens == int((batch.labels != IGNORE).sum())
    assert batch.layout == "bshd" and batch.tokens == 64 * len(docs)
