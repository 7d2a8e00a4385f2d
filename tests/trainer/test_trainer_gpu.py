"""The trainer's CUDA paths: FlashAttention varlen against the CPU oracle, both layouts and the
static form training, torch.compile, and no host synchronization on an ordinary step.

Run on the H200 machine: ``python -m pytest -m gpu tests/trainer``.
"""

from __future__ import annotations

import math

import pytest
import torch

from packscope.trainer.attention import DocumentMaskedAttention, VarlenAttention, attention_for
from packscope.trainer.config import DataConfig, TrainConfig
from packscope.trainer.packing import pack_thd
from packscope.trainer.train import Trainer, run_training, train_step

pytestmark = pytest.mark.gpu  # deselected by default (pyproject addopts); run with -m gpu

SHORT_DOCS = DataConfig(min_len=8, short_median=24, long_median=96)
CUDA = torch.device("cuda")


def gpu_run(**overrides) -> TrainConfig:
    base = dict(steps=60, pack_length=256, packs_per_step=2, device="cuda", progress=False, data=SHORT_DOCS)
    return TrainConfig(**{**base, **overrides})


def step(trainer: Trainer) -> torch.Tensor:
    return train_step(trainer, trainer.next_batches())


@pytest.mark.parametrize("static", [False, True])
def test_varlen_matches_the_masked_oracle(static):
    g = torch.Generator().manual_seed(0)
    docs = [torch.randint(1, 100, (n,), generator=g) for n in (300, 17, 1, 64, 129, 500, 2)]
    batch = pack_thd(docs, 512, n_packs=3, max_docs_per_pack=4, align=8, static=static).to(CUDA)
    attention = attention_for(batch, CUDA)
    assert isinstance(attention, VarlenAttention)
    q, k, v = (torch.randn(1, batch.tokens, h, 64, device=CUDA, requires_grad=True) for h in (8, 2, 2))
    out = attention(*(t.bfloat16() for t in (q, k, v)))
    grads = torch.autograd.grad(out.float().square().sum(), (q, k, v))
    oracle = DocumentMaskedAttention(batch.cu_seqlens_padded, batch.tokens)
    ref = oracle(q, k, v)
    ref_grads = torch.autograd.grad(ref.square().sum(), (q, k, v))

    # bf16 operands: judge by the relative error of the whole tensor (a wrong mask or a
    # missed document boundary gives errors of order 1, rounding gives ~1e-3).
    def rel_err(got, want):
        return float((got.float() - want).norm() / want.norm())

    assert rel_err(out, ref) < 1e-2
    for name, got, want in zip("qkv", grads, ref_grads, strict=True):
        assert rel_err(got, want) < 2e-2, name


def test_both_layouts_give_the_same_first_loss_on_cuda():
    losses = []
    for layout in ("thd", "bshd"):
        trainer = Trainer(gpu_run(layout=layout))
        batches = trainer.next_batches()
        labels = sum(b.label_tokens for b in batches)
        losses.append(sum(float(trainer.forward_backward(b, labels)) for b in batches))
    assert losses[0] == pytest.approx(losses[1], rel=1e-2)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(layout="thd"),
        dict(layout="thd", static=True, align=8),
        dict(layout="bshd"),
        dict(layout="thd", static=True, compile=True),
        dict(layout="thd", micro_batches=2),
    ],
    ids=["thd", "thd-static", "bshd", "thd-static-compiled", "thd-accumulate"],
)
def test_loss_falls_on_cuda(overrides):
    trainer = Trainer(gpu_run(**overrides))
    losses = [float(step(trainer)) for _ in range(trainer.cfg.steps)]
    assert all(math.isfinite(x) for x in losses)
    assert sum(losses[-10:]) / 10 < 0.7 * losses[0]


@pytest.mark.parametrize("layout", ["thd", "bshd"])
def test_an_ordinary_step_never_waits_for_the_device(layout):
    trainer = Trainer(gpu_run(layout=layout, static=layout == "thd"))
    step(trainer)  # first step: lazy initialisation (cuBLAS, optimizer state)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        for _ in range(3):
            step(trainer)
    finally:
        torch.cuda.set_sync_debug_mode("default")


def test_run_training_on_cuda_with_the_agent():
    summary = run_training(gpu_run(steps=20, log_every=5, static=True))
    assert math.isfinite(summary["final_loss"]) and summary["final_loss"] < summary["first_loss"]


@pytest.mark.slow
@pytest.mark.parametrize("layout", ["thd", "bshd"])
def test_1b_preset_trains_a_few_steps(layout):
    # BSHD gives every document a full row, so its micro-batches hold many more token slots.
    cfg = gpu_run(
        preset="1b",
        layout=layout,
        steps=3,
        pack_length=2048,
        packs_per_step=4,
        micro_batches=2,
        data=DataConfig(),
        static=layout == "thd",
    )
    trainer = Trainer(cfg)
    losses = [float(step(trainer)) for _ in range(cfg.steps)]
    assert all(math.isfinite(x) for x in losses)
    assert losses[0] == pytest.approx(math.log(32000), rel=0.1)
