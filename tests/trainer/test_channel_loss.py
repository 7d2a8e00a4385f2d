"""Per-channel loss: the vectorized form, the legacy per-document loop and a brute force agree,
for THD (dynamic and static) and BSHD batches with extra masked tokens."""

from __future__ import annotations

import pytest
import torch

from packscope.trainer.channel_loss import channel_loss_sums, channel_loss_sums_loop, span_bounds, span_channels
from packscope.trainer.data import Document
from packscope.trainer.packing import IGNORE, pack_bshd, pack_thd

CHANNELS = 4
BASE = 1000  # document j is made of token BASE + j only, so a label names its document


def _documents(n: int, seed: int) -> tuple[list[Document], list[int]]:
    g = torch.Generator().manual_seed(seed)
    docs = []
    for j in range(n):
        tokens = torch.full((int(torch.randint(1, 90, (), generator=g)),), BASE + j)
        docs.append(Document(tokens, channel=int(torch.randint(CHANNELS, (), generator=g))))
    return docs, [d.channel for d in docs]


def _brute_force(token_losses, labels, channels) -> torch.Tensor:
    sums = torch.zeros(CHANNELS, 2, dtype=torch.float64)
    for loss, label in zip(token_losses.flatten().tolist(), labels.flatten().tolist(), strict=True):
        if label != IGNORE:
            c = channels[label - BASE]
            sums[c, 0] += loss
            sums[c, 1] += 1
    return sums


@pytest.mark.parametrize(
    "layout,static,align", [("thd", False, 1), ("thd", True, 8), ("thd", True, 1), ("bshd", False, 1)]
)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vectorized_equals_loop_equals_brute_force(layout, static, align, seed):
    docs, channels = _documents(40, seed)
    if layout == "thd":
        batch = pack_thd([d.tokens for d in docs], 256, n_packs=12, max_docs_per_pack=8, align=align, static=static)
    else:
        batch = pack_bshd([d.tokens for d in docs], 128)
    g = torch.Generator().manual_seed(100 + seed)
    labels = batch.labels.clone()
    labels[torch.rand(labels.shape, generator=g) < 0.25] = IGNORE  # masked tokens besides the padding
    token_losses = 5 * torch.rand(labels.shape, generator=g)
    bounds, of_spans = span_bounds(batch), span_channels(docs, batch, max_docs_per_pack=8, align=align)

    fast = channel_loss_sums(token_losses, labels, bounds, of_spans, CHANNELS)
    loop = channel_loss_sums_loop(token_losses, labels, bounds, of_spans, CHANNELS)
    brute = _brute_force(token_losses, labels, channels)
    for got in (fast, loop):
        assert torch.equal(got[:, 1], brute[:, 1])  # token counts: exact
        torch.testing.assert_close(got[:, 0], brute[:, 0], rtol=1e-5, atol=0)
    assert brute[:, 1].sum() > 0


def test_the_legacy_loop_reads_two_bounds_per_document(monkeypatch):
    docs, _ = _documents(10, 0)
    batch = pack_thd([d.tokens for d in docs], 256, n_packs=4, max_docs_per_pack=8)
    reads = []
    original = torch.Tensor.item
    monkeypatch.setattr(torch.Tensor, "item", lambda t: reads.append(1) or original(t))
    args = (
        torch.rand(batch.labels.shape),
        batch.labels,
        span_bounds(batch),
        span_channels(docs, batch, 8, 1),
        CHANNELS,
    )
    channel_loss_sums(*args)
    assert not reads
    channel_loss_sums_loop(*args)
    assert len(reads) == 2 * len(docs)


def test_the_trainer_sends_channel_loss_per_interval_either_way():
    from packscope.agent import Agent, AgentConfig
    from packscope.trainer.config import DataConfig, TrainConfig
    from packscope.trainer.data import CHANNELS
    from packscope.trainer.train import Trainer, train_step

    records = []
    for legacy in (False, True):
        cfg = TrainConfig(
            preset="tiny",
            steps=4,
            pack_length=128,
            packs_per_step=2,
            micro_batches=2,
            device="cpu",
            progress=False,
            data=DataConfig(min_len=8, short_median=24, long_median=64),
            channel_loss=True,
            legacy_channel_loss=legacy,
        )
        trainer = Trainer(cfg)
        agent = Agent(AgentConfig(log_every=2, count_syncs=False), model=trainer.model_cfg.to_model_spec())
        for _ in range(cfg.steps):
            train_step(trainer, trainer.next_batches(), agent)
        agent.close()
        records.append([r["channel_loss"] for r in agent.records])
    fast, loop = records
    assert len(fast) == 2 and set(fast[0]) <= set(CHANNELS) and len(fast[0]) >= 2
    for a, b in zip(fast, loop, strict=True):
        assert a.keys() == b.keys()
        for name in a:
            assert a[name] == pytest.approx(b[name], rel=1e-6)
