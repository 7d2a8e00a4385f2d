"""Batches whose documents the model attends across (the HF callback's cross-document check found
it, agent/integrations/cross_documents.py) are counted as the work the model did: their THD
attention sums take each row as one sequence of its real tokens, while the documents, the tokens
and the histograms stay those of the real documents. Held to a brute-force count over any mix of
forms, with and without such batches, wherever folds fall."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import packscope.agent.accumulator as accumulator
from packscope.agent import Agent, AgentConfig, ModelSpec
from packscope.agent.accumulator import IntervalAccumulator, decode
from tests.agent.test_deferred_forms import CHUNK, WINDOW, _chunk, _window, added, micro_batch, packs_of

THD_SUMS = {"seqlen_sq_sum_thd": lambda s: s * s, "window_sq_sum_thd": _window, "chunk_sq_sum_thd": _chunk}


def whole_row_truth(kind: str, packs: list[list[int]], row_len: int) -> dict:
    """brute(), with the THD attention sums over each row's real tokens as one sequence."""
    _, truth = micro_batch(kind, packs, row_len)
    # A flat row without documents is one token (micro_batch's row [0]): one document of 1.
    rows = [sum(d for p in packs for d in p) or 1] if kind == "flat" else [sum(p) for p in packs]
    for name, term in THD_SUMS.items():
        truth[name] = sum(term(s) for s in rows)
    return truth


batches = st.lists(
    st.tuples(
        st.sampled_from(["mask", "position_ids", "flat", "cu_seqlens"]),
        st.integers(4, 40),
        st.lists(st.lists(st.integers(0, 12), max_size=5), min_size=1, max_size=4),
        st.booleans(),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=40, deadline=None)
@given(batches, st.sampled_from([1 << 22, 64, 1]))
def test_whole_row_batches_count_rows_and_the_others_documents(micro_batches, fold_slots):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(accumulator, "FOLD_SLOTS", fold_slots)
        acc = IntervalAccumulator(window=WINDOW, chunk=CHUNK)
        expected = None
        for kind, row_len, lengths, whole in micro_batches:
            packs = packs_of(lengths, row_len)
            batch, truth = micro_batch(kind, packs, row_len)
            if whole and kind != "mask":  # padded rows hold one document each: nothing to cross
                batch.whole_row = True
                truth = whole_row_truth(kind, packs, row_len)
            acc.add(batch)
            expected = truth if expected is None else added(expected, truth)
        got = decode(acc.reduce(torch.device("cpu")).tolist(), acc.host.as_list())
    assert got == expected


def test_the_agent_counts_a_crossing_batch_as_whole_rows_and_says_the_baseline_is_equal():
    """Through observe_batch: a flattened row of documents [3, 5, 8] attended whole has the THD
    attention of one 16-token sequence, so its per-document FLOPs equal the baseline's."""
    model = ModelSpec(layers=2, hidden=64, heads=4, ffn=128, vocab=256)
    position_ids = torch.tensor([list(range(3)) + list(range(5)) + list(range(8))])
    counted = {}
    for whole in (False, True):
        agent = Agent(AgentConfig(server=None, log_every=1), model=model)
        agent.step_begin()
        agent.observe_batch(position_ids=position_ids, whole_row_attention=whole)
        agent.step_end()
        agent.close()
        (record,) = agent.records
        counted[whole] = record
    assert counted[False]["seqlen_sq_sum_thd"] == 3 * 3 + 5 * 5 + 8 * 8
    assert counted[True]["seqlen_sq_sum_thd"] == 16 * 16 == counted[True]["seqlen_sq_sum_bshd"]
    assert counted[True]["flops_thd"] == counted[True]["flops_bshd"] > counted[False]["flops_thd"]
    for key in ("documents", "real_tokens", "tokens"):
        assert counted[True][key] == counted[False][key]
