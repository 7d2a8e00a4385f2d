"""Logging the way training loops used to do it: the "before" of the published sync fixes.

``--legacy-logging`` turns this on, so that the agent's sync counter has something to find.
Each pattern sits on its own line, so each shows up as its own code site:

* the loss and the gradient norm read with ``.item()`` every step, to be printed every N;
* a loss accumulator seeded with ``torch.tensor([0.0], device=...)`` every step (a pageable
  host-to-device copy, which blocks);
* a host timer around ``torch.cuda.synchronize()`` at both ends of the step;
* a NaN check per bucket of parameters read into Python control flow.

The fixed path (the default) does none of these: the agent gets device tensors, and time comes
from CUDA events.
"""

from __future__ import annotations

import logging
import time

import torch
from torch import nn

log = logging.getLogger("packscope.trainer")
BUCKET_PARAMS = 16  # parameters per NaN-check bucket, as a DDP gradient bucket would hold
PRINT_EVERY = 10


class LegacyLogging:
    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.cuda = device.type == "cuda"
        self.steps = 0
        self.started = 0.0
        self.loss = self.grad_norm = self.step_seconds = float("nan")

    def step_begin(self) -> None:
        if self.cuda:
            torch.cuda.synchronize()  # sync: so that the host timer measures this step alone
        self.started = time.perf_counter()

    def loss_accumulator(self) -> torch.Tensor:
        return torch.tensor([0.0], device=self.device)  # sync: a pageable copy, every step

    def check_gradients(self, model: nn.Module) -> None:
        params = [p for p in model.parameters() if p.grad is not None]
        for start in range(0, len(params), BUCKET_PARAMS):
            bucket = params[start : start + BUCKET_PARAMS]
            if torch.stack([torch.isnan(p.grad).any() for p in bucket if p.grad is not None]).any():  # sync per bucket
                raise FloatingPointError(f"NaN gradient in parameters {start}..{start + len(bucket) - 1}")

    def step_end(self, loss: torch.Tensor, grad_norm: torch.Tensor) -> None:
        self.loss = loss.item()  # sync
        self.grad_norm = grad_norm.item()  # sync
        if self.cuda:
            torch.cuda.synchronize()  # sync
        self.step_seconds = time.perf_counter() - self.started
        self.steps += 1
        if self.steps % PRINT_EVERY == 0:
            log.info(
                "step %d loss %.4f grad_norm %.3f %.1f ms",
                self.steps,
                self.loss,
                self.grad_norm,
                1e3 * self.step_seconds,
            )
