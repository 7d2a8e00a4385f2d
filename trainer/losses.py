"""Cross-entropy over the LM head without float32 logits for every token.

The plain path materialises logits [T, vocab] in bf16, a float32 copy of them, the float32
log-softmax and its gradient: at 16k tokens and a 32k vocabulary that is several GiB of
memory-bound passes per micro-batch. Here the head's matmul and the loss run over chunks of
tokens: each chunk's logits are computed in the compute dtype, reduced to a float32
logsumexp, and turned into the gradients of the head's input and weight right away (the loss
is a sum, so its gradient is known in the forward pass up to the one scalar that backward
brings). At most one chunk of logits is alive at a time, and no matmul is recomputed.

The numerics are the plain path's: bf16 logits from a bf16 matmul, then a float32 logsumexp.
"""

from __future__ import annotations

import torch

IGNORE = -100
CHUNK_TOKENS = 4096  # 4096 x 32k float32 logits: 0.5 GiB alive at a time


class _ChunkedCrossEntropy(torch.autograd.Function):
    """(sum of the per-token losses, the per-token losses) of ``h @ w.T`` against ``labels``;
    only the sum is differentiable."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, w: torch.Tensor, labels: torch.Tensor, chunk: int):
        wants_grad = any(ctx.needs_input_grad[:2])
        token_losses = torch.zeros(h.shape[0], dtype=torch.float32, device=h.device)
        grad_h = torch.empty_like(h)
        grad_w = torch.zeros(w.shape, dtype=torch.float32, device=w.device)  # summed over chunks
        for start in range(0, h.shape[0], chunk):
            hc, yc = h[start : start + chunk], labels[start : start + chunk]
            valid = yc != IGNORE
            target = yc.clamp(min=0)[:, None]  # no boolean indexing: that would sync
            logits = (hc @ w.T).float()
            lse = torch.logsumexp(logits, dim=-1)
            token_losses[start : start + chunk] = (lse - logits.gather(1, target)[:, 0]) * valid
            if not wants_grad:
                continue
            # d(loss)/d(logits) = softmax - onehot(target), zero on ignored tokens; in place,
            # so that one float32 chunk is all the memory it takes.
            probs = logits.sub_(lse[:, None]).exp_()
            probs.scatter_add_(1, target, torch.full_like(lse[:, None], -1.0))
            grad_logits = probs.mul_(valid[:, None]).to(h.dtype)
            grad_h[start : start + chunk] = grad_logits @ w
            grad_w += (grad_logits.T @ hc).float()
        ctx.save_for_backward(grad_h, grad_w.to(w.dtype))
        ctx.mark_non_differentiable(token_losses)
        return token_losses.sum(), token_losses

    @staticmethod
    def backward(ctx, grad_sum: torch.Tensor, _grad_tokens: torch.Tensor | None):
        grad_h, grad_w = ctx.saved_tensors
        return grad_h * grad_sum.to(grad_h.dtype), grad_w * grad_sum.to(grad_w.dtype), None, None


@torch.compiler.disable  # a loop of eager kernels; a compiled model calls it as is
def chunked_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    dtype: torch.dtype | None = None,
    chunk: int = CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Cross-entropy of the logits ``hidden @ weight.T``, as (float32 sum over labelled tokens,
    float32 per-token losses with 0 where the label is ``IGNORE``). ``dtype`` is the matmul's;
    by default autocast's when it is on (as it would run the head), else the hidden states'."""
    device = hidden.device.type
    if dtype is None:
        dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    with torch.autocast(hidden.device.type, enabled=False):
        h = hidden.reshape(-1, hidden.shape[-1]).to(dtype)
        return _ChunkedCrossEntropy.apply(h, weight.to(dtype), labels.reshape(-1), chunk)
