"""The chunked cross-entropy against F.cross_entropy on the full logits: values and gradients."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from packscope.trainer.losses import IGNORE, chunked_cross_entropy


def _problem(tokens=97, hidden=32, vocab=211, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(tokens, hidden, generator=g, dtype=torch.float64).float().requires_grad_()
    w = (0.3 * torch.randn(vocab, hidden, generator=g)).requires_grad_()
    labels = torch.randint(vocab, (tokens,), generator=g)
    labels[torch.rand(tokens, generator=g) < 0.3] = IGNORE
    return h, w, labels


@pytest.mark.parametrize("chunk", [7, 32, 97, 4096])
def test_matches_cross_entropy_values_and_gradients(chunk):
    h, w, labels = _problem()
    total, per_token = chunked_cross_entropy(h, w, labels, chunk=chunk)
    (1.7 * total).backward()  # a non-unit upstream gradient must scale both gradients
    got = (h.grad.clone(), w.grad.clone())
    h.grad = w.grad = None

    ref_tokens = F.cross_entropy(h @ w.T, labels, ignore_index=IGNORE, reduction="none")
    (1.7 * ref_tokens.sum()).backward()
    torch.testing.assert_close(per_token, ref_tokens.detach(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(total, ref_tokens.sum().detach(), rtol=1e-5, atol=1e-4)
    assert per_token[labels == IGNORE].eq(0).all()
    torch.testing.assert_close(got[0], h.grad, rtol=1e-4, atol=1e-6)
    torch.testing.assert_close(got[1], w.grad, rtol=1e-4, atol=1e-6)


def test_bfloat16_matmul_matches_the_autocast_path():
    # The trainer's plain path: bf16 logits under autocast, then a float32 cross-entropy.
    h, w, labels = _problem(tokens=64, hidden=64, vocab=300, seed=1)
    total, _ = chunked_cross_entropy(h, w, labels, dtype=torch.bfloat16, chunk=16)
    total.backward()
    got = (h.grad.clone(), w.grad.clone())
    h.grad = w.grad = None
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = F.linear(h, w)
    ref = F.cross_entropy(logits.float(), labels, ignore_index=IGNORE, reduction="sum")
    ref.backward()
    torch.testing.assert_close(total, ref.detach(), rtol=2e-3, atol=1e-2)
    for a, b in zip(got, (h.grad, w.grad), strict=True):
        assert float((a - b).norm() / b.norm()) < 2e-2


def test_only_the_sum_carries_a_gradient_and_shapes_flatten():
    h, w, labels = _problem(tokens=24)
    total, per_token = chunked_cross_entropy(h.view(2, 12, -1), w, labels.view(2, 12), chunk=5)
    assert per_token.shape == (24,) and not per_token.requires_grad and total.requires_grad


def test_autocast_picks_the_matmul_dtype():
    h, w, labels = _problem(tokens=16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        under_autocast, _ = chunked_cross_entropy(h, w, labels)
    explicit, _ = chunked_cross_entropy(h, w, labels, dtype=torch.bfloat16)
    assert torch.equal(under_autocast, explicit)
