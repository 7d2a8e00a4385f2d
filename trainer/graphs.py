"""CUDA graphs for the static THD form (``--cuda-graphs``): forward and backward of one
micro-batch captured once, replayed for every micro-batch that fits.

What makes the step capturable:

* static shapes: the static THD form keeps the token count and the number of ``cu_seqlens``
  entries fixed (a dummy tail holds the padding, zero-length spans fill the rest), and the
  varlen kernel's ``max_seqlen`` is a host int, captured as the pack length;
* static inputs: each micro-batch is copied into the captured input buffers (device to device,
  no sync), and the loss scale 1 / (labelled tokens of the step) is written into a device
  scalar with ``fill_``;
* static gradients: they exist before capture and backward adds into them in place, so
  gradient accumulation works by replaying once per micro-batch; the optimizer step (fused
  AdamW), clipping and zeroing run eagerly outside the graph, on those same tensors, which
  therefore must never be set to None (the trainer zeroes them in place under graphs);
* a private memory pool for the graph's activations (torch.cuda.graph's default).

With --compile the compiled forward and backward are captured the same way: torch.compile
compiles them during the warm-up iterations, before the capture, and the graph replays
Inductor's kernels.

A batch that does not fit (a span longer than the captured ``max_seqlen``, which happens when
whole packs stay empty, or another size) runs eagerly on the same gradients.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING, cast

import torch

from packscope.trainer.packing import Batch

if TYPE_CHECKING:
    from packscope.trainer.train import Trainer

WARMUP_ITERS = 3  # on a side stream before capture, as PyTorch's CUDA graph notes advise


class GraphedStep:
    """Forward + backward of a Trainer's micro-batch as one CUDA graph, captured on first use."""

    def __init__(self, trainer: Trainer) -> None:
        if trainer.device.type != "cuda":
            raise ValueError("--cuda-graphs needs a CUDA device; this run is on the CPU")
        self.trainer = trainer
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static: Batch | None = None
        self.scale = torch.ones((), device=trainer.device)
        self.loss_sum: torch.Tensor | None = None
        self.token_losses: torch.Tensor | None = None
        self.replays = 0
        self.fallbacks = 0

    def fits(self, batch: Batch) -> bool:
        """Whether ``batch`` can replay the graph (any static THD batch can be the first)."""
        if not batch.static:
            return False
        s = self.static
        assert batch.cu_seqlens_padded is not None  # a static batch is THD
        return s is None or (
            batch.tokens == s.tokens
            and batch.cu_seqlens_padded.shape == cast(torch.Tensor, s.cu_seqlens_padded).shape
            and batch.max_seqlen <= s.max_seqlen
        )

    def run(self, batch: Batch, label_tokens: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Add ``batch``'s gradients (loss scaled by 1 / ``label_tokens``); return (summed loss,
        per-token losses): the graph's buffers, valid until the next replay, or eager tensors
        for a batch that does not fit."""
        if not self.fits(batch):
            self.fallbacks += 1
            return self.trainer.eager_forward_backward(batch, label_tokens)
        if self.graph is None:
            self._capture(batch)
        s, graph = self.static, self.graph
        assert s is not None and graph is not None and self.loss_sum is not None  # set by _capture
        assert s.cu_seqlens_padded is not None and batch.cu_seqlens_padded is not None  # THD, static
        s.input_ids.copy_(batch.input_ids)
        s.position_ids.copy_(batch.position_ids)
        s.labels.copy_(batch.labels)
        s.cu_seqlens_padded.copy_(batch.cu_seqlens_padded)
        self.scale.fill_(1.0 / label_tokens)
        graph.replay()
        self.replays += 1
        return self.loss_sum, self.token_losses

    def _capture(self, batch: Batch) -> None:
        trainer = self.trainer
        params = [p for p in trainer.model.parameters() if p.requires_grad]
        if any(p.grad is not None for p in params):
            raise RuntimeError("capture must come before the first backward: the graph owns the gradients")
        for p in params:
            p.grad = torch.zeros_like(p)
        # The varlen kernel sizes its grid by max_seqlen: the pack length covers every batch
        # whose packs are all in use; the others run eagerly.
        assert batch.cu_seqlens_padded is not None  # fits() took only static THD batches
        self.static = replace(
            batch,
            input_ids=batch.input_ids.clone(),
            position_ids=batch.position_ids.clone(),
            labels=batch.labels.clone(),
            cu_seqlens_padded=batch.cu_seqlens_padded.clone(),
            max_seqlen=max(batch.max_seqlen, batch.pack_length),
        )
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(WARMUP_ITERS):
                loss_sum, _ = trainer.loss_terms(self.static)
                (loss_sum * self.scale).backward()
        torch.cuda.current_stream().wait_stream(side)
        grads = [p.grad for p in params if p.grad is not None]  # all set above
        torch._foreach_zero_(grads)  # warm-up gradients are not the step's
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.loss_sum, self.token_losses = trainer.loss_terms(self.static)
            (self.loss_sum * self.scale).backward()
        if any(p.grad is not g for p, g in zip(params, grads, strict=True)):
            raise RuntimeError("backward replaced a gradient during capture instead of adding into it")
