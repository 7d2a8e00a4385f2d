"""Data parallelism for the reference trainer: the process group from torchrun's environment,
each rank's device and documents, and the model wrapped for DDP or FSDP2.

`packscope train --parallel ddp|fsdp2` expects to be started by torchrun (RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR/PORT in the environment); NCCL on CUDA, gloo on the CPU.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import cast

import torch
import torch.distributed as dist
from torch import nn

# Rank r > 0 draws documents from seed + r * DATA_SEED_STRIDE: far enough apart that the ranks of
# one run never share a stream with another run's rank 0 of a nearby --seed.
DATA_SEED_STRIDE = 1_000_003


@dataclass(frozen=True)
class Parallel:
    kind: str  # "none", "ddp" or "fsdp2"
    rank: int = 0
    world_size: int = 1
    owns_group: bool = False  # this module started the process group, so it ends it

    def data_seed(self, seed: int) -> int:
        """Each rank its own documents; rank 0 those of a single-process run with the same seed."""
        return seed + self.rank * DATA_SEED_STRIDE

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def setup(kind: str, device: torch.device) -> tuple[Parallel, torch.device]:
    """Join (or start) the process group for `kind`; return it and this rank's device."""
    if kind == "none":
        return Parallel(kind), device
    owns = not dist.is_initialized()
    if owns and ("RANK" not in os.environ or "WORLD_SIZE" not in os.environ):
        raise ValueError(
            f"--parallel {kind} runs one process per GPU: start it with torchrun, e.g. "
            f"torchrun --nproc-per-node 2 -m packscope train --parallel {kind} ..."
        )
    if device.type == "cuda":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        torch.cuda.set_device(device)
    if owns:
        # device_id binds NCCL to this rank's GPU at once (no guessing, no lazy init).
        dist.init_process_group(
            "nccl" if device.type == "cuda" else "gloo", device_id=device if device.type == "cuda" else None
        )
    return Parallel(kind, dist.get_rank(), dist.get_world_size(), owns), device


def wrap(model: nn.Module, parallel: Parallel, device: torch.device) -> nn.Module:
    """What the training step calls forward on: DDP's wrapper, or the model itself, sharded in
    place by FSDP2 (create the optimizer after this, over the sharded parameters)."""
    if parallel.kind == "ddp":
        return nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None)
    if parallel.kind == "fsdp2":
        from torch.distributed.fsdp import fully_shard

        for layer in cast(nn.ModuleList, model.layers):  # one all-gather per layer, overlapped with the next
            fully_shard(layer)
        fully_shard(model)
        return model
    return model


def local(value: torch.Tensor) -> torch.Tensor:
    """A plain tensor for the agent: FSDP2's gradient norm is a replicated DTensor (no copy, no
    collective: its value is already the same on every rank)."""
    from torch.distributed.tensor import DTensor

    return value.to_local() if isinstance(value, DTensor) else value
