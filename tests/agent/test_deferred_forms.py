"""Per-token batches (position_ids, attention masks) and the integrations' losses are kept by
reference and counted at the log boundary: the counts equal a brute-force computation whatever
the mix of forms and wherever a fold (the bound on what is held) falls, and a step that is not a
boundary runs no ATen op for them at all."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils._python_dispatch import TorchDispatchMode

import packscope.agent.accumulator as accumulator
import packscope.agent.integrations.losses as losses
from packscope.agent import Agent, AgentConfig, ModelSpec
from packscope.agent.accumulator import IntervalAccumulator, decode
from packscope.agent.batch_forms import from_attention_mask, from_cu_seqlens, from_position_ids
from packscope.agent.histograms import NUM_BUCKETS, bucket_of
from packscope.agent.integrations.losses import MeanLoss, TokenWeightedLoss
from packscope.core.audio_sums import AUDIO_RECORD_SUMS


class CountOps(TorchDispatchMode):
    """Counts the ATen ops that compute (views and other metadata ops excepted)."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not func.is_view:
            self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


# A window and a chunk shorter than some documents and rows, so that folds add their sums too.
WINDOW, CHUNK = 5, 4


def _window(s: int) -> int:
    return s * s if s <= WINDOW else 2 * s * WINDOW - WINDOW * WINDOW


def _chunk(s: int) -> int:
    return (s // CHUNK) * CHUNK * CHUNK + (s % CHUNK) ** 2


def brute(packs: list[list[int]], row_len: int) -> dict:
    docs = [d for p in packs for d in p if d > 0]
    doc_hist = [[0] * NUM_BUCKETS, [0] * NUM_BUCKETS]
    pack_hist = [[0] * NUM_BUCKETS, [0] * NUM_BUCKETS]
    for d in docs:
        doc_hist[0][bucket_of(d)] += 1
        doc_hist[1][bucket_of(d)] += d
    for p in packs:
        if sum(p):
            pack_hist[0][bucket_of(sum(p))] += 1
            pack_hist[1][bucket_of(sum(p))] += sum(p)
    return {
        "tokens": len(packs) * row_len,
        "packs": len(packs),
        "real_tokens": sum(docs),
        "documents": len(docs),
        "seqlen_sq_sum_bshd": len(packs) * row_len**2,
        "seqlen_sq_sum_thd": sum(d * d for d in docs),
        "window_sq_sum_bshd": len(packs) * _window(row_len),
        "window_sq_sum_thd": sum(_window(d) for d in docs),
        "chunk_sq_sum_bshd": len(packs) * _chunk(row_len),
        "chunk_sq_sum_thd": sum(_chunk(d) for d in docs),
        **dict.fromkeys(("vision_images", "vision_patches", "vision_sq_sum", "vision_window_sq_sum"), 0),
        **dict.fromkeys(("cross_text_tokens", "cross_pairs"), 0),
        **dict.fromkeys(AUDIO_RECORD_SUMS, 0),  # no clips
        "expert_assignments": 0,  # no router of zero-computation experts
        "histograms": {
            "documents": {"count": doc_hist[0], "tokens": doc_hist[1]},
            "packs": {"count": pack_hist[0], "tokens": pack_hist[1]},
        },
    }


def added(a, b):
    if isinstance(a, dict):
        return {k: added(a[k], b[k]) for k in a}
    if isinstance(a, list):
        return [added(x, y) for x, y in zip(a, b, strict=True)]
    return a + b


def packs_of(draw_lengths: list[list[int]], row_len: int) -> list[list[int]]:
    """Each row's documents, cut to fit row_len."""
    out = []
    for docs in draw_lengths:
        row, total = [], 0
        for d in docs:
            if total + d <= row_len:
                row.append(d)
                total += d
        out.append(row)
    return out


def micro_batch(kind: str, packs: list[list[int]], row_len: int):
    """One batch of `kind` holding `packs`, and its brute-force counts."""
    if kind == "mask":  # BSHD padded rows: one document per row
        mask = torch.tensor([[1] * sum(p) + [0] * (row_len - sum(p)) for p in packs])
        return from_attention_mask(mask), brute([[sum(p)] for p in packs], row_len)
    pos, mask = [], []
    for p in packs:
        row = [i for d in p for i in range(d)]
        mask.append([1] * len(row) + [0] * (row_len - len(row)))
        pos.append(row + [0] * (row_len - len(row)))
    if kind == "position_ids":  # padded rows; padding marked by the mask
        return from_position_ids(torch.tensor(pos), torch.tensor(mask)), brute(packs, row_len)
    if kind == "flat":  # one unpadded row, as DataCollatorWithFlattening makes it
        docs = [d for p in packs for d in p if d > 0]
        row = [i for d in docs for i in range(d)] or [0]
        return from_position_ids(torch.tensor(row)), brute([docs or [1]], len(row))
    cu = [0]
    for r, p in enumerate(packs):
        for d in p:
            cu.append(cu[-1] + d)
        if cu[-1] < (r + 1) * row_len:
            cu.append((r + 1) * row_len)  # the row's padding, masked out
    token_mask = torch.tensor(mask).reshape(-1).bool()
    return from_cu_seqlens(torch.tensor(cu), (len(packs), row_len), token_mask=token_mask), brute(packs, row_len)


batches = st.lists(
    st.tuples(
        st.sampled_from(["mask", "position_ids", "flat", "cu_seqlens"]),
        st.integers(4, 40),
        st.lists(st.lists(st.integers(0, 12), max_size=5), min_size=1, max_size=4),
    ),
    min_size=1,
    max_size=8,
)


@settings(max_examples=80, deadline=None)
@given(batches, st.sampled_from([1 << 22, 64, 1]))
def test_an_interval_of_mixed_forms_equals_brute_force_wherever_folds_fall(micro_batches, fold_slots):
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(accumulator, "FOLD_SLOTS", fold_slots)  # 1: every batch folded as it comes
        acc = IntervalAccumulator(window=WINDOW, chunk=CHUNK)
        expected = None
        for kind, row_len, lengths in micro_batches:
            batch, truth = micro_batch(kind, packs_of(lengths, row_len), row_len)
            acc.add(batch)
            expected = truth if expected is None else added(expected, truth)
        got = decode(acc.reduce(torch.device("cpu")).tolist(), acc.host.as_list())
    assert got == expected


def test_folding_bounds_what_is_held():
    acc = IntervalAccumulator()
    row = torch.arange(1000) % 100  # ten documents of 100 tokens
    for _ in range(int(accumulator.FOLD_SLOTS // 1000) + 5):
        acc.add(from_position_ids(row))
    assert len(acc._tokens) <= 5 and acc._partial is not None  # folded once, past FOLD_SLOTS
    got = decode(acc.reduce(torch.device("cpu")).tolist(), acc.host.as_list())
    assert got["documents"] == 10 * (accumulator.FOLD_SLOTS // 1000 + 5)


MODEL = ModelSpec(layers=2, hidden=64, heads=4, ffn=128, vocab=256)


@pytest.mark.parametrize(
    "form",
    [
        {"position_ids": torch.arange(512) % 128},
        {"position_ids": torch.arange(64).repeat(4, 1), "attention_mask": torch.ones(4, 64, dtype=torch.long)},
        {"attention_mask": torch.ones(4, 64, dtype=torch.bool)},
        {"cu_seqlens": torch.tensor([0, 100, 512]), "shape": (1, 512), "token_mask": torch.ones(512, dtype=torch.bool)},
        {"shape": (4, 64)},
    ],
    ids=["position_ids", "position_ids+mask", "attention_mask", "cu_seqlens+mask", "shape"],
)
def test_an_ordinary_step_runs_no_op_for_any_form(form):
    agent = Agent(AgentConfig(log_every=4, count_syncs=False), model=MODEL)
    counted = []
    for step in range(1, 9):
        with CountOps() as ops:
            agent.step_begin()
            agent.observe_batch(**form)
            agent.observe_batch(**form)
            agent.step_end(loss=None)
        counted.append((step, len(ops.ops)))
    agent.close()
    assert all(n == 0 for step, n in counted if step % 4), counted  # nothing between boundaries
    assert all(n > 0 for step, n in counted if form.keys() != {"shape"} and step % 4 == 0)  # the work is there
    assert [r["documents"] for r in agent.records] == [agent.records[0]["documents"]] * 2


# -- the losses ---------------------------------------------------------------------------------
def reference_loss(steps: list[list[tuple]]) -> float:
    """The mean over steps of Σ loss·w / Σ targets, computed one micro-batch at a time."""
    per_step = []
    for pieces in steps:
        summed = counted = 0.0
        for loss, labels, shifted, divisor in pieces:
            targets = (labels if shifted else labels[..., 1:]).ne(-100).sum().item()
            weight = targets if divisor is None else float(divisor)
            summed += float(loss) * weight
            counted += targets
        per_step.append(summed / max(counted, 1))
    return sum(per_step) / len(per_step)


def random_steps(seed: int) -> list[list[tuple]]:
    rng = random.Random(seed)
    steps = []
    for _ in range(rng.randint(1, 5)):
        divisor_kind = rng.choice(["none", "int", "tensor"])
        step_divisor = torch.tensor(rng.randint(5, 50)) if divisor_kind == "tensor" else rng.randint(5, 50)
        pieces = []
        for _ in range(rng.randint(1, 3)):
            shape = rng.choice([(rng.randint(1, 30),), (rng.randint(1, 3), rng.randint(1, 12))])
            labels = torch.randint(-1, 20, shape)
            labels[labels < 2] = -100  # a share of ignored labels
            shifted = rng.random() < 0.5
            divisor = None if divisor_kind == "none" else step_divisor
            pieces.append((torch.tensor(rng.uniform(0.5, 4.0), dtype=torch.bfloat16), labels, shifted, divisor))
        steps.append(pieces)
    return steps


@pytest.mark.parametrize("seed", range(30))
@pytest.mark.parametrize("fold_slots", [1 << 22, 1])
def test_the_token_weighted_loss_equals_one_micro_batch_at_a_time(seed, fold_slots, monkeypatch):
    monkeypatch.setattr(losses, "FOLD_SLOTS", fold_slots)
    steps = random_steps(seed)
    kept = TokenWeightedLoss()
    for pieces in steps:
        for loss, labels, shifted, divisor in pieces:
            kept.add(loss, labels, shifted=shifted, divisor=divisor)
        kept.end_step()
    kept.add(torch.tensor(99.0), torch.ones(4, dtype=torch.long), shifted=True, divisor=None)  # a step never ended
    got = kept.interval_mean()
    assert got is not None and got.dtype == torch.float64
    assert float(got) == pytest.approx(reference_loss(steps), rel=1e-12)
    assert kept.interval_mean() is None  # forgotten once given


def test_the_mean_loss_of_uneven_steps_is_the_mean_of_step_means(monkeypatch):
    kept = MeanLoss()
    for step_losses in ([1.0, 3.0], [10.0], [2.0, 2.0, 8.0]):
        for value in step_losses:
            kept.add(torch.tensor(value / 2), scale=2)  # as Lightning hands them, divided by accumulation
        kept.end_step()
    assert float(kept.interval_mean()) == pytest.approx((2.0 + 10.0 + 4.0) / 3)


def test_keeping_losses_runs_no_op_until_the_boundary():
    kept = TokenWeightedLoss()
    loss, labels, divisor = torch.tensor(2.0), torch.randint(0, 5, (2, 16)), torch.tensor(30)
    with CountOps() as ops:
        for _ in range(3):
            kept.add(loss, labels, shifted=False, divisor=divisor)
            kept.add(loss, labels, shifted=False, divisor=divisor)
            kept.end_step()
    assert ops.ops == []
    with CountOps() as ops:
        kept.interval_mean()
    assert 0 < len(ops.ops) < 40, ops.ops  # one chain for the interval, not one per micro-batch
