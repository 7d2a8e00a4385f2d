"""The per-kind attention sums: their references against pairs counted one by one from
transformers' own mask functions, the stated relation to exact pair counts, the chunk rule, and
the elementwise form the agent evaluates on the device."""

from __future__ import annotations

import pytest

from packscope.core.attention import (
    ATTENTION_SUMS,
    SUM_NAMES,
    attention_sums,
    chunk_sq,
    full_sq,
    kind_sq,
    window_sq,
)

torch = pytest.importorskip("torch")
masking = pytest.importorskip("transformers.masking_utils")


def brute_pairs(mask_function, s: int) -> int:
    """(query, key) pairs of one unpacked sequence of length s that a mask function allows, each
    pair evaluated (on index grids: transformers' mask functions take tensors)."""
    q, k = torch.arange(s)[:, None], torch.arange(s)[None, :]
    zero = torch.tensor(0)
    return int(torch.as_tensor(mask_function(zero, zero, q, k)).expand(s, s).sum())


LENGTHS = range(27)


@pytest.mark.parametrize("s", LENGTHS)
def test_full_causal_pairs_are_half_of_s_squared_plus_s(s):
    assert 2 * brute_pairs(masking.causal_mask_function, s) == full_sq(s) + s


@pytest.mark.parametrize("window", [1, 2, 5, 8])
@pytest.mark.parametrize("s", LENGTHS)
def test_sliding_window_pairs(s, window):
    """s² if s ≤ W, else 2sW - W², and 2·pairs exceeds it by min(s, W)."""
    pairs = brute_pairs(masking.sliding_window_causal_mask_function(window), s)
    assert 2 * pairs == window_sq(s, window) + min(s, window)
    assert window_sq(s, window) == (s * s if s <= window else 2 * s * window - window * window)


@pytest.mark.parametrize("chunk", [1, 3, 4, 7])
@pytest.mark.parametrize("s", LENGTHS)
def test_chunked_pairs(s, chunk):
    """Σ over chunks of c², and 2·pairs exceeds it by s (each chunk is causal)."""
    pairs = brute_pairs(masking.chunked_causal_mask_function(chunk, torch.zeros(1, dtype=torch.long)), s)
    assert 2 * pairs == chunk_sq(s, chunk) + s
    chunks = [chunk] * (s // chunk) + ([s % chunk] if s % chunk else [])
    assert chunk_sq(s, chunk) == sum(c * c for c in chunks)


def packed_pairs(create, config, docs: list[int]) -> int:
    """Pairs of transformers' mask builder for one row packed by position_ids (restarting at 0)."""
    pos = torch.cat([torch.arange(s) for s in docs]).unsqueeze(0)
    mask = create(
        config=config, inputs_embeds=torch.empty(1, sum(docs), 1), attention_mask=None, cache=None, position_ids=pos
    )
    return int(mask.sum())


def row_aligned_pairs(docs: list[int], chunk: int) -> int:
    """What chunks cut at multiples of C in the row (not in the document) would let through."""
    doc = torch.repeat_interleave(torch.arange(len(docs)), torch.tensor(docs))
    i = torch.arange(sum(docs))
    q, k = i[:, None], i[None, :]
    allowed = (doc[:, None] == doc[None, :]) & (k <= q) & (q // chunk == k // chunk)
    return int(allowed.sum())


def test_chunks_start_at_each_document_not_at_the_row():
    """Where a document sits in its row does not move its chunks: transformers' Llama 4 mask
    compares positions (which restart per document), not row indexes."""
    from transformers import Llama4TextConfig

    config = Llama4TextConfig(attention_chunk_size=4, num_hidden_layers=1)
    config._attn_implementation = "sdpa"
    for docs in ([1, 13], [13, 1], [3, 9, 4], [5, 5, 5]):
        pairs = packed_pairs(masking.create_chunked_causal_mask, config, docs)
        assert 2 * pairs == sum(chunk_sq(s, 4) + s for s in docs)
    # The two rules differ on a document that starts inside a chunk of its row: 32 pairs, not 30.
    assert packed_pairs(masking.create_chunked_causal_mask, config, [1, 13]) == 32
    assert row_aligned_pairs([1, 13], 4) == 30


def test_attention_sums_of_packs_match_the_definitions():
    packs = [[4096, 2048, 1024, 512, 256, 256], [3000, 2500, 1500]]
    sums = attention_sums(packs, 8192, window=1024, chunk=2048)
    assert set(sums) == set(SUM_NAMES)
    docs = [s for p in packs for s in p]
    assert sums["seqlen_sq_sum_thd"] == sum(s * s for s in docs) == 39913312
    assert sums["seqlen_sq_sum_bshd"] == 2 * 8192**2
    assert sums["window_sq_sum_thd"] == sum(min(s, 1024) * (2 * s - min(s, 1024)) for s in docs)
    assert sums["window_sq_sum_bshd"] == 2 * (2 * 8192 * 1024 - 1024**2)
    assert sums["chunk_sq_sum_thd"] == sum((s // 2048) * 2048**2 + (s % 2048) ** 2 for s in docs)
    assert sums["chunk_sq_sum_bshd"] == 2 * 4 * 2048**2
    assert attention_sums(packs, 8192) == {k: sums[k] for k in ("seqlen_sq_sum_thd", "seqlen_sq_sum_bshd")}


def test_names_are_the_wire_names():
    assert {k: (v.thd, v.bshd) for k, v in ATTENTION_SUMS.items()} == {
        "full": ("seqlen_sq_sum_thd", "seqlen_sq_sum_bshd"),
        "sliding": ("window_sq_sum_thd", "window_sq_sum_bshd"),
        "chunked": ("chunk_sq_sum_thd", "chunk_sq_sum_bshd"),
    }


def test_elementwise_forms_for_the_device():
    """The tensor expressions docs/flops.md gives the agent (no loop over documents) equal the
    references, zero-length entries included."""
    lengths = torch.tensor([0, 1, 3, 4, 5, 127, 128, 129, 1000, 4096, 8191, 8192, 8193, 20000])
    for window in (1, 128, 4096):
        m = torch.minimum(lengths, torch.tensor(window))
        assert (2 * lengths * m - m * m).tolist() == [window_sq(int(s), window) for s in lengths]
    for chunk in (1, 128, 8192):
        got = (lengths // chunk) * chunk * chunk + (lengths % chunk) ** 2
        assert got.tolist() == [chunk_sq(int(s), chunk) for s in lengths]


@pytest.mark.parametrize(
    "call,message",
    [
        (lambda: window_sq(-1, 4), "length"),
        (lambda: window_sq(True, 4), "length"),
        (lambda: window_sq(3, 0), "window"),
        (lambda: chunk_sq(3, 2.0), "chunk"),
        (lambda: kind_sq("linear", 3), "no attention sum"),
        (lambda: kind_sq("sliding", 3), "needs the window"),
        (lambda: attention_sums([]), "at least one pack"),
        (lambda: attention_sums([[3, 0]]), "positive"),
        (lambda: attention_sums([[9000]], 8192), "more than the pack length"),
    ],
)
def test_bad_inputs_are_refused(call, message):
    with pytest.raises(ValueError, match=message):
        call()
