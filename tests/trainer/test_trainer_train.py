"""The data and the loop: same documents in both layouts, same loss at step 0, a loss that falls
on the tiny preset, a full run with the agent attached, and a resumed run that continues it."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator

import pytest
import torch

from packscope.trainer.config import DataConfig, TrainConfig
from packscope.trainer.data import CHANNELS, DocumentStream, step_documents
from packscope.trainer.packing import first_fit_decreasing
from packscope.trainer.train import Trainer, lr_at, run_training, train_step

# Short documents: many per step, so a few hundred tokens already mix many rules.
SHORT_DOCS = DataConfig(min_len=8, short_median=24, long_median=96)


@pytest.fixture(autouse=True)
def _one_intra_op_thread() -> Iterator[None]:
    """On this busy 2-core machine, two intra-op threads made a CPU step of the tiny preset take
    0.5-4.7 s instead of a steady 0.2 s with one (measured); no number checked here changes."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def small_run(**overrides) -> TrainConfig:
    base = dict(steps=100, pack_length=256, packs_per_step=2, device="cpu", progress=False, data=SHORT_DOCS)
    return TrainConfig(**{**base, **overrides})


def step(trainer: Trainer) -> torch.Tensor:
    return train_step(trainer, trainer.next_batches())


def test_documents_are_deterministic_and_clipped():
    a, b = (iter(DocumentStream(DataConfig(), 512, 300, seed=3)) for _ in range(2))
    docs = [next(a) for _ in range(300)]
    again = itertools.islice(b, 300)
    assert all(torch.equal(x.tokens, y.tokens) and x.channel == y.channel for x, y in zip(docs, again, strict=True))
    lengths = [len(d) for d in docs]
    assert min(lengths) >= 16 and max(lengths) == 300  # the long mode gets clipped
    assert sum(n < 200 for n in lengths) > 150  # mostly short, chat-like
    assert all(int(d.tokens.min()) >= 0 and int(d.tokens.max()) < 512 for d in docs)
    assert {d.channel for d in docs} == set(range(len(CHANNELS)))  # every source shows up
    # a document's tokens stay in its rule's band, and its rule is its source
    band = 512 // DataConfig().rules
    assert all(int(d.tokens.min()) // band % len(CHANNELS) == d.channel for d in docs)
    other = iter(DocumentStream(DataConfig(), 512, 300, seed=4))
    assert not torch.equal(docs[0].tokens, next(other).tokens)


def test_steps_fit_the_token_budget():
    docs = iter(DocumentStream(DataConfig(), 512, 256, seed=0))
    steps = step_documents(docs, micro_batches=2, packs_per_micro_batch=3, pack_length=256, max_docs_per_pack=4)
    for _ in range(20):
        step = next(steps)
        assert len(step) == 2
        for group in step:
            assert len(first_fit_decreasing([len(d) for d in group], 256, 4)) <= 3


def test_both_layouts_see_the_same_documents_and_the_same_first_loss():
    cfg = dict(pack_length=128, packs_per_step=4, micro_batches=2, max_docs_per_pack=8)
    thd, bshd = Trainer(small_run(layout="thd", **cfg)), Trainer(small_run(layout="bshd", **cfg))
    t_batches, b_batches = thd.next_batches(), bshd.next_batches()
    assert [sorted(b.doc_lengths) for b in t_batches] == [sorted(b.doc_lengths) for b in b_batches]
    assert sum(b.real_tokens for b in t_batches) == sum(b.real_tokens for b in b_batches)
    assert sum(b.tokens for b in t_batches) == 4 * 128 < sum(b.tokens for b in b_batches)

    losses = []
    for trainer, batches in ((thd, t_batches), (bshd, b_batches)):
        labels = sum(b.label_tokens for b in batches)
        losses.append(sum(float(trainer.forward_backward(b, labels)) for b in batches))
    assert losses[0] == pytest.approx(math.log(512), rel=0.05)
    assert losses[0] == pytest.approx(losses[1], rel=1e-5)


def test_loss_falls_on_the_tiny_preset():
    trainer = Trainer(small_run(steps=40))
    losses = [float(step(trainer)) for _ in range(trainer.cfg.steps)]
    assert all(math.isfinite(x) for x in losses)
    # From ln(vocab) = 6.2, past ln(band) = 4.2 (which tokens a document may use) into the
    # transitions themselves: 2.9 (0.46x) over the last 10 steps when written.
    assert losses[0] == pytest.approx(math.log(512), rel=0.05)
    assert sum(losses[-10:]) / 10 < 0.6 * losses[0]


def test_static_shapes_train_the_same_as_dynamic():
    dynamic, static = Trainer(small_run(steps=3)), Trainer(small_run(steps=3, static=True))
    for _ in range(3):
        torch.testing.assert_close(step(static), step(dynamic), rtol=1e-4, atol=1e-5)


def test_lr_schedule_warms_up_then_decays_to_a_tenth():
    cfg = small_run(steps=50, warmup_steps=5, lr=1e-3)
    lrs = [lr_at(s, cfg) for s in range(50)]
    assert lrs[0] == pytest.approx(2e-4) and lrs[4] == pytest.approx(1e-3)
    assert lrs[-1] == pytest.approx(1e-4)
    assert all(a >= b for a, b in itertools.pairwise(lrs[4:]))


def test_run_training_with_the_agent():
    summary = run_training(small_run(steps=6, log_every=3))
    assert summary["steps"] == 6 and isinstance(summary["run_id"], str)
    assert math.isfinite(summary["final_loss"]) and math.isfinite(summary["first_loss"])
    assert summary["token_slots"] == 6 * 2 * 256 >= summary["real_tokens"] > 0


def test_a_resumed_run_continues_the_steps_the_data_and_the_schedule():
    whole, resumed = Trainer(small_run(steps=10)), Trainer(small_run(steps=10, start_step=3, run_id="r"))
    for _ in range(3):
        step(whole)
    assert resumed.step == whole.step == 3
    wanted, batches = whole.next_batches(), resumed.next_batches()
    for want, got in zip(wanted, batches, strict=True):
        assert torch.equal(want.input_ids, got.input_ids) and want.doc_lengths == got.doc_lengths
    train_step(resumed, batches)
    assert resumed.step == 4 and resumed.optimizer.param_groups[0]["lr"] == lr_at(3, resumed.cfg)


def test_run_training_resumes_the_given_run_id_after_the_start_step():
    summary = run_training(small_run(steps=8, log_every=2, start_step=4, run_id="resumed-run"))
    assert summary["run_id"] == "resumed-run"
    assert (summary["start_step"], summary["steps"]) == (4, 4)
    assert summary["token_slots"] == 4 * 2 * 256
