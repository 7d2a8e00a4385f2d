"""Every batch form against a brute-force per-document computation (hypothesis)."""

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from packscope.agent.accumulator import IntervalAccumulator, decode, problems
from packscope.agent.batch_forms import (
    baseline_sq_sum,
    from_attention_mask,
    from_cu_seqlens,
    from_position_ids,
    from_shape,
)
from packscope.agent.histograms import NUM_BUCKETS, bucket_of
from packscope.core.audio_sums import AUDIO_RECORD_SUMS

# A sliding window and an attention chunk shorter than the packs, so documents and packs fall on
# both sides of each (the forms below all count them too).
WINDOW, CHUNK = 24, 16


def _window(s: int) -> int:
    """Causal (query, key) pairs within a window of W, in the s²/2 convention: s² up to W."""
    return s * s if s <= WINDOW else 2 * s * WINDOW - WINDOW * WINDOW


def _chunk(s: int) -> int:
    """Chunks of C from the document's start, each c² (docs/flops.md)."""
    whole, rest = divmod(s, CHUNK)
    return whole * CHUNK * CHUNK + rest * rest


def brute(packs: list[list[int]], pack_len: int) -> dict:
    """Reference: packs given as real document lengths (zeros allowed and ignored)."""
    docs = [d for p in packs for d in p if d > 0]
    dh = [[0] * NUM_BUCKETS, [0] * NUM_BUCKETS]
    ph = [[0] * NUM_BUCKETS, [0] * NUM_BUCKETS]
    for d in docs:
        dh[0][bucket_of(d)] += 1
        dh[1][bucket_of(d)] += d
    for p in packs:
        if sum(p):
            ph[0][bucket_of(sum(p))] += 1
            ph[1][bucket_of(sum(p))] += sum(p)
    return {
        "tokens": len(packs) * pack_len,
        "packs": len(packs),
        "real_tokens": sum(docs),
        "documents": len(docs),
        "seqlen_sq_sum_bshd": len(packs) * pack_len**2,
        "seqlen_sq_sum_thd": sum(d * d for d in docs),
        "window_sq_sum_bshd": len(packs) * _window(pack_len),
        "window_sq_sum_thd": sum(_window(d) for d in docs),
        "chunk_sq_sum_bshd": len(packs) * _chunk(pack_len),
        "chunk_sq_sum_thd": sum(_chunk(d) for d in docs),
        **dict.fromkeys(("vision_images", "vision_patches", "vision_sq_sum", "vision_window_sq_sum"), 0),  # no images
        **dict.fromkeys(("cross_text_tokens", "cross_pairs"), 0),  # no cross-attention
        **dict.fromkeys(AUDIO_RECORD_SUMS, 0),  # no clips
        "expert_assignments": 0,  # no router of zero-computation experts
        "histograms": {"documents": {"count": dh[0], "tokens": dh[1]}, "packs": {"count": ph[0], "tokens": ph[1]}},
    }


def reduce(*batches) -> dict:
    acc = IntervalAccumulator(window=WINDOW, chunk=CHUNK)
    for b in batches:
        acc.add(b)
    return decode(acc.reduce(torch.device("cpu")).tolist(), acc.host.as_list())


def packs_strategy(pack_len):
    """Packs of documents (zero-length ones included) that fit pack_len, possibly empty packs."""

    def fit(docs):
        out, total = [], 0
        for d in docs:
            if total + d <= pack_len:
                out.append(d)
                total += d
        return out

    return st.lists(st.lists(st.integers(0, pack_len), max_size=6).map(fit), min_size=1, max_size=5)


PACK_LEN = 64


def padded_pair_batch(packs):
    """cu_seqlens + cu_seqlens_padded: docs back to back inside each pack, each pack padded at
    its end; the padded boundaries put the pack padding on the last document of every pack."""
    unpadded, padded = [0], [0]
    for i, p in enumerate(packs):
        docs = p or [0]
        for j, d in enumerate(docs):
            unpadded.append(unpadded[-1] + d)
            padded.append((i + 1) * PACK_LEN if j == len(docs) - 1 else padded[-1] + d)
    batch = from_cu_seqlens(
        torch.tensor(unpadded, dtype=torch.int32),
        (len(packs), PACK_LEN),
        cu_seqlens_padded=torch.tensor(padded, dtype=torch.int32),
    )
    return batch, brute(packs, PACK_LEN)


def static_tail_batch(packs, repeats):
    """One long row of len(packs) * PACK_LEN slots: all documents back to back, then a dummy
    tail sequence holding the padding, then repeated boundaries up to a static entry count."""
    docs = [d for p in packs for d in p]
    slots = len(packs) * PACK_LEN
    cu = [0]
    for d in docs:
        cu.append(cu[-1] + d)
    if cu[-1] < slots:
        cu.append(slots)  # the dummy tail
    cu += [slots] * repeats
    mask = torch.arange(slots) < sum(docs)  # the trainer's padding mask: the tail is padding
    return from_cu_seqlens(torch.tensor(cu, dtype=torch.int32), (1, slots), token_mask=mask), brute([docs], slots)


def position_ids_batch(packs):
    pos, mask = [], []
    for p in packs:
        row_pos, row_mask = [], []
        for d in p:
            row_pos += list(range(d))
            row_mask += [1] * d
        pad = PACK_LEN - len(row_pos)
        row_pos += [0] * pad
        row_mask += [0] * pad
        pos.append(row_pos)
        mask.append(row_mask)
    return from_position_ids(torch.tensor(pos), torch.tensor(mask)), brute(packs, PACK_LEN)


def merged(results: list[dict]) -> dict:
    """Totals of several batches: every count and histogram bucket adds up."""

    def add(a, b):
        if isinstance(a, dict):
            return {k: add(a[k], b[k]) for k in a}
        if isinstance(a, list):
            return [add(x, y) for x, y in zip(a, b, strict=True)]
        return a + b

    out = results[0]
    for r in results[1:]:
        out = add(out, r)
    return out


@settings(max_examples=150, deadline=None)
@given(packs_strategy(PACK_LEN))
def test_cu_seqlens_with_padded_pair(packs):
    batch, exp = padded_pair_batch(packs)
    assert reduce(batch) == exp


@settings(max_examples=150, deadline=None)
@given(packs_strategy(PACK_LEN), st.integers(0, 4))
def test_cu_seqlens_static_padding_dummy_tail_and_repeated_boundaries(packs, repeats):
    batch, exp = static_tail_batch(packs, repeats)
    assert reduce(batch) == exp


@settings(max_examples=100, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["padded", "static", "position_ids"]), packs_strategy(PACK_LEN), st.integers(0, 3)),
        min_size=1,
        max_size=6,
    )
)
def test_an_interval_of_mixed_micro_batches(micro_batches):
    # Many micro-batches in one interval, cu_seqlens forms (canonicalised together at the
    # boundary, packs numbered after the other forms') interleaved with a per-token form.
    built = []
    for kind, packs, repeats in micro_batches:
        if kind == "padded":
            built.append(padded_pair_batch(packs))
        elif kind == "static":
            built.append(static_tail_batch(packs, repeats))
        else:
            built.append(position_ids_batch(packs))
    assert reduce(*(b for b, _ in built)) == merged([e for _, e in built])


@settings(max_examples=150, deadline=None)
@given(packs_strategy(PACK_LEN))
def test_position_ids_with_padding_mask(packs):
    batch, exp = position_ids_batch(packs)
    assert reduce(batch) == exp


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, PACK_LEN), min_size=1, max_size=6).map(lambda ds: list(ds)))
def test_position_ids_single_unpadded_row(docs):
    row = [i for d in docs for i in range(d)]
    got = reduce(from_position_ids(torch.tensor(row)))
    assert got == brute([docs], len(row))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, PACK_LEN), min_size=1, max_size=8))
def test_attention_mask_rows(lengths):
    mask = torch.tensor([[1] * n + [0] * (PACK_LEN - n) for n in lengths])
    got = reduce(from_attention_mask(mask))
    assert got == brute([[n] for n in lengths], PACK_LEN)


def test_plain_shape_and_mixed_micro_batches():
    cu = torch.tensor([0, 10, 10, 40], dtype=torch.int32)  # a zero-length document in the middle
    got = reduce(from_shape((3, 32)), from_cu_seqlens(cu, (1, 40)))
    exp_plain, exp_cu = brute([[32], [32], [32]], 32), brute([[10, 0, 30]], 40)
    for key in ("tokens", "real_tokens", "documents", "packs", "seqlen_sq_sum_bshd", "seqlen_sq_sum_thd"):
        assert got[key] == exp_plain[key] + exp_cu[key]
    assert got["seqlen_sq_sum_bshd"] >= got["seqlen_sq_sum_thd"]


def test_lengths_past_the_last_edge_land_in_the_open_bucket():
    n = (1 << 23) + 5
    got = reduce(from_cu_seqlens(torch.tensor([0, n]), (1, n)))
    assert got["histograms"]["documents"]["count"][-1] == 1
    assert got["histograms"]["documents"]["tokens"][-1] == n


# -- what a batch says about itself: problems found on the device, the baseline's packs ----------------
def problem_counts(*batches) -> dict:
    acc = IntervalAccumulator()
    for b in batches:
        acc.add(b)
    return problems(acc.reduce(torch.device("cpu")).tolist())


@settings(max_examples=60, deadline=None)
@given(packs_strategy(PACK_LEN), st.integers(0, 4))
def test_well_formed_cu_seqlens_have_no_problems(packs, repeats):
    assert problem_counts(padded_pair_batch(packs)[0], static_tail_batch(packs, repeats)[0]) == {}


def test_problems_of_cu_seqlens_tensors_are_counted_per_entry():
    def cu(values, shape=(1, 16), padded=None):
        tensor = torch.tensor(values)
        return from_cu_seqlens(tensor, shape, None if padded is None else torch.tensor(padded))

    assert problem_counts(cu([0, 10, 4, 2, 16])) == {"decreasing": 2}
    assert problem_counts(cu([0, 10, 20])) == {"out_of_range": 1}
    assert problem_counts(cu([-3, 10])) == {"out_of_range": 1}
    assert problem_counts(cu([0, 6, 12], padded=[0, 4, 16])) == {"inconsistent": 1}
    # Counted over every batch of the interval, whatever the others hold.
    assert problem_counts(cu([0, 10, 4, 16]), cu([0, 8, 16]), cu([0, 20])) == {"decreasing": 1, "out_of_range": 1}
    # The counts that still go out stay harmless: no negative length reaches S2 or the histograms.
    acc = IntervalAccumulator()
    acc.add(cu([0, 10, 4, 16]))
    got = decode(acc.reduce(torch.device("cpu")).tolist(), acc.host.as_list())
    assert got["seqlen_sq_sum_thd"] == 100 + 144 and got["documents"] == 2


@given(st.integers(1, 5), st.integers(1, 5000), st.one_of(st.none(), st.integers(1, 2048)))
def test_the_baseline_counts_ceil_row_over_pack_length_packs(rows, row_len, pack_length):
    if pack_length is None or row_len <= pack_length:
        want = rows * row_len**2
    else:
        packs = 0
        while packs * pack_length < row_len:
            packs += 1
        want = rows * packs * pack_length**2
    assert baseline_sq_sum(rows, row_len, pack_length) == want
    # Only packed forms take a pack length: padded rows are dense sequences as they are.
    mask = torch.ones(rows, row_len)
    assert from_attention_mask(mask).baseline_pack_length is None
    cu = torch.tensor([0, row_len])
    assert from_cu_seqlens(cu, (1, row_len), pack_length=pack_length).baseline_pack_length == pack_length
    pos = torch.arange(row_len).repeat(rows, 1)
    assert from_position_ids(pos, pack_length=pack_length).baseline_pack_length == pack_length
