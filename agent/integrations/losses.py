"""An interval's mean loss from references kept per micro-batch, computed at the log boundary.

The agent's record holds the mean over the interval's steps of each step's loss. Computing each
step's loss when the step ends costs a chain of small kernels per micro-batch (the targets in
its labels, the weighting) and per step; on a fast GPU those launches are most of an
integration's host time. So the integrations only keep references (the micro-batch's loss
tensor, its labels, its divisor) and hand the agent `interval_mean` (``Agent.interval_loss``),
which its boundary calls: the whole interval in about 25 ops, whatever its length, and nothing
read back. The kept tensors must not be modified in place before the interval ends (a Trainer's
fresh batches never are). What is kept is folded into a running device sum once its labels pass
FOLD_SLOTS token slots, so a long interval does not hold every batch.

* `TokenWeightedLoss` (Hugging Face Trainer, TRL, torchtitan): a step's loss is its summed loss
  over its target tokens, Σ loss_i·w_i / Σ t_i, where t_i counts micro-batch i's labels other
  than the ignore index (after the causal shift unless they come shifted) and w_i is the
  divisor the model normalised by (num_items_in_batch), or t_i when it normalised by its own.
* `MeanLoss` (Lightning): a step's loss is the mean of its micro-batches' losses, each times a
  scale known on the host (Lightning's division by accumulate_grad_batches undone).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass

import torch

from packscope.agent.batch_forms import host_table

FOLD_SLOTS = 1 << 22  # label slots held before the completed steps are folded (32 MiB of int64)


@dataclass(slots=True)
class _Piece:
    step: int  # the step's number among this interval's steps that had a loss
    loss: torch.Tensor
    labels: torch.Tensor | None = None
    shifted: bool = True  # the labels are the targets already (no causal shift to apply)
    divisor: torch.Tensor | float | None = None  # None: the model normalised by its own targets
    scale: float = 1.0


class _StepLosses(ABC):
    """Pieces by step; the completed steps are folded into (Σ of step losses, number of steps)."""

    def __init__(self) -> None:
        self._pieces: list[_Piece] = []
        self._done = 0  # pieces that belong to completed steps
        self._steps = 0  # completed steps with a loss, not yet folded
        self._held_slots = 0
        self._sum: torch.Tensor | None = None  # float64 device sum of the folded steps' losses
        self._folded_steps = 0

    def _add(self, piece: _Piece) -> None:
        self._pieces.append(piece)
        if piece.labels is not None:
            self._held_slots += piece.labels.numel()

    def _step(self) -> int:
        return self._steps

    def end_step(self) -> None:
        """The optimizer step is over: its pieces form one step's loss (none: a step without)."""
        if len(self._pieces) > self._done:
            self._done = len(self._pieces)
            self._steps += 1
            if self._held_slots >= FOLD_SLOTS:
                self._fold()

    def interval_mean(self) -> torch.Tensor | None:
        """The mean over the interval's completed steps of their losses (a float64 device
        scalar), None without any; forgets them, and any pieces of a step that did not end."""
        self._fold()
        total, steps = self._sum, self._folded_steps
        self._pieces, self._done, self._steps, self._held_slots = [], 0, 0, 0
        self._sum, self._folded_steps = None, 0
        return None if total is None else total / steps

    def _fold(self) -> None:
        if not self._done:
            return
        pieces, rest = self._pieces[: self._done], self._pieces[self._done :]
        with torch.no_grad():
            losses = self._step_losses(pieces, self._steps).sum()
        self._sum = losses if self._sum is None else self._sum + losses
        self._folded_steps += self._steps
        for piece in rest:  # the step still open is now the first
            piece.step = 0
        self._pieces, self._done, self._steps = rest, 0, 0
        self._held_slots = sum(p.labels.numel() for p in rest if p.labels is not None)

    @abstractmethod
    def _step_losses(self, pieces: list[_Piece], steps: int) -> torch.Tensor:
        """The losses of the completed steps `pieces` belong to (their sum is what is folded):
        each subclass's rule for a step's loss."""


def _stacked(tensors: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """0-d tensors as one float64 vector: one stack (the usual case), not one op each."""
    if all(t.dim() == 0 and t.device == device for t in tensors):
        return torch.stack(tensors).to(torch.float64)
    return torch.stack([t.reshape(()).to(device, torch.float64) for t in tensors])


class TokenWeightedLoss(_StepLosses):
    def __init__(self, ignore_index: int = -100) -> None:
        super().__init__()
        self.ignore_index = ignore_index

    def add(
        self, loss: torch.Tensor, labels: torch.Tensor, *, shifted: bool, divisor: torch.Tensor | float | None
    ) -> None:
        """One micro-batch: `loss` as the model returned it (detached), `labels` as it got them
        (`shifted`: already the targets, e.g. `shift_labels`), `divisor` its normaliser."""
        self._add(_Piece(self._step(), loss, labels, shifted, divisor))

    def _step_losses(self, pieces: list[_Piece], steps: int) -> torch.Tensor:
        device = pieces[0].loss.device
        losses = _stacked([p.loss for p in pieces], device)
        targets = self._targets(pieces, device)
        weights = self._weights(pieces, targets, device)
        step_of = host_table([[p.step for p in pieces]], device)[0]
        summed = torch.zeros(steps, dtype=torch.float64, device=device).index_add_(0, step_of, losses * weights)
        counted = torch.zeros(steps, dtype=torch.float64, device=device).index_add_(0, step_of, targets)
        return summed / counted.clamp(min=1)

    def _targets(self, pieces: list[_Piece], device: torch.device) -> torch.Tensor:
        """Per piece, its labels other than the ignore index, less each row's first label when
        the loss shifts them: prefix sums of one flat mask at the pieces' bounds."""
        labels = [p.labels for p in pieces if p.labels is not None]
        flat = torch.cat([t.reshape(-1) for t in labels]).to(device) if len(labels) > 1 else labels[0].reshape(-1)
        valid = flat.ne(self.ignore_index)
        bounds, firsts, start = [0], list[int](), 0
        for p in pieces:
            assert p.labels is not None  # TokenWeightedLoss.add always has labels
            if not p.shifted:  # the first label of each row is never a target
                row_len = p.labels.shape[-1] if p.labels.dim() else 1
                firsts += range(start, start + p.labels.numel(), row_len)
            start += p.labels.numel()
            bounds.append(start)
        if firsts:
            valid.index_fill_(0, host_table([firsts], device)[0], False)
        prefix = torch.cat([valid.new_zeros(1, dtype=torch.int64), valid.to(torch.int64).cumsum(0)])
        ends = host_table([bounds], device)[0]
        return (prefix[ends[1:]] - prefix[ends[:-1]]).to(torch.float64)

    @staticmethod
    def _weights(pieces: list[_Piece], targets: torch.Tensor, device: torch.device) -> torch.Tensor:
        """w_i: the divisor the loss was normalised by, or its targets when there was none. The
        divisor is usually one tensor per step (num_items_in_batch), stacked once each."""
        if all(p.divisor is None for p in pieces):
            return targets
        distinct: dict[int, int] = {}
        tensors: list[torch.Tensor] = []
        table = []  # per piece: kind (0 targets, 1 a host number, 2 a device tensor), value
        for p in pieces:
            if p.divisor is None:
                table.append([0.0, 0.0])
            elif isinstance(p.divisor, torch.Tensor):
                index = distinct.setdefault(id(p.divisor), len(tensors))
                if index == len(tensors):
                    tensors.append(p.divisor)
                table.append([2.0, float(index)])
            else:
                table.append([1.0, float(p.divisor)])
        kind, value = host_table(table, device, torch.float64).T
        weights = torch.where(kind == 1, value, targets)
        if tensors:
            on_device = _stacked(tensors, device)[value.to(torch.int64).clamp(max=len(tensors) - 1)]
            weights = torch.where(kind == 2, on_device, weights)
        return weights


class MeanLoss(_StepLosses):
    def add(self, loss: torch.Tensor, scale: float = 1.0) -> None:
        """One micro-batch's loss (detached), to be multiplied by `scale`."""
        self._add(_Piece(self._step(), loss, scale=scale))

    def _step_losses(self, pieces: list[_Piece], steps: int) -> torch.Tensor:
        device = pieces[0].loss.device
        per_step = [0] * steps
        for p in pieces:
            per_step[p.step] += 1
        # Σ over a step of loss_i · scale_i / (its micro-batches) is the step's mean.
        weights = host_table([[p.scale / per_step[p.step] for p in pieces]], device, torch.float64)[0]
        return (_stacked([p.loss for p in pieces], device) * weights).sum().reshape(1)
