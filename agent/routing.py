"""The routing of a model with zero-computation experts (LongCat-Flash), counted on the device.

Which top-k slot of a token goes to a real expert, and which to a zero-computation one (an identity
that runs no GEMM), is the router's choice, so the routed experts' work is known only from the
routing (``ModelSpec.routing_dependent``). A forward hook on each such MoE block's router adds the
slots it sent to real experts to one 0-d int64 device tensor: a compare and a sum per MoE layer and
forward, no read, no host sync. The agent takes the tensor at each interval's end (``take``: a host
swap, so a later forward counts into the next interval) and reduces it with the interval's other
device sums into the record's ``expert_assignments``.

Counted once per training forward: not in evaluation (a module in eval mode, or grad off), and not
when gradient checkpointing re-runs a forward inside the backward (autograd's graph task is then
running), which would count the same routing twice.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def _zero_expert_routers(model: nn.Module) -> list[tuple[nn.Module, int]]:
    """(router, real experts) of every MoE block with zero-computation experts: transformers'
    LongcatFlashMoE keeps its real experts' count as ``num_routed_experts`` beside
    ``zero_expert_num``, and its router returns (logits, weights, indices)."""
    found = []
    for module in model.modules():
        router: Any = getattr(module, "router", None)
        if getattr(module, "zero_expert_num", 0) and isinstance(router, nn.Module):
            found.append((router, int(getattr(module, "num_routed_experts"))))  # noqa: B009 - a torch Module attribute
    return found


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


class RoutingCounter:
    """Assignments to real experts since the last ``take``, on the device."""

    def __init__(self, model: nn.Module) -> None:
        routers = _zero_expert_routers(model)
        if not routers:
            raise ValueError(
                f"{type(model).__name__} has no MoE block with zero-computation experts (zero_expert_num, a router): "
                "there is no routing to count"
            )
        self._total: torch.Tensor | None = None
        self._handles = [router.register_forward_hook(self._hook(real)) for router, real in routers]

    def _hook(self, real: int) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if not (module.training and torch.is_grad_enabled()) or _in_backward():
                return
            indices = output[2]
            count = (indices < real).sum()  # a device op: nothing is read
            self._total = count if self._total is None else self._total + count

        return hook

    def take(self) -> torch.Tensor | None:
        """The count since the last take (None: no training forward ran), and a fresh start."""
        total, self._total = self._total, None
        return total

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
