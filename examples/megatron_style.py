"""A Megatron-LM-style `train_step` with packscope (docs/agent.md, "Megatron-LM-style loops").

    python examples/megatron_style.py --server http://127.0.0.1:8000

Megatron is not imported: `PackedSeqParams` below has the fields of
`megatron.core.packed_seq_params.PackedSeqParams`, which is all the agent reads (duck typing).
In a real run, observe in `forward_step` on the first virtual stage of the first pipeline stage
only, and give the agent `dp_group=mpu.get_data_parallel_group()`; this one-stage stand-in
observes every micro-batch it runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from dataclasses import dataclass

import torch

from packscope.agent import Agent, AgentConfig, ModelSpec

SEQ_LENGTH, VOCAB, MICRO_BATCHES = 1024, 256, 4


@dataclass
class PackedSeqParams:  # the fields of Megatron's
    qkv_format: str
    cu_seqlens_q: torch.Tensor
    cu_seqlens_kv: torch.Tensor
    cu_seqlens_q_padded: torch.Tensor | None = None
    cu_seqlens_kv_padded: torch.Tensor | None = None
    max_seqlen_q: int | None = None
    max_seqlen_kv: int | None = None


def batches(g: torch.Generator) -> Iterator[tuple[torch.Tensor, PackedSeqParams]]:
    """Packs of documents, each document padded to a multiple of 8 (the padded boundaries)."""
    while True:
        real, padded = [0], [0]
        while True:
            length = int(torch.randint(16, 300, (1,), generator=g))
            slot = -(-length // 8) * 8
            if padded[-1] + slot > SEQ_LENGTH:
                break
            real.append(real[-1] + length)
            padded.append(padded[-1] + slot)
        cu, cu_padded = torch.tensor(real, dtype=torch.int32), torch.tensor(padded, dtype=torch.int32)
        params = PackedSeqParams("thd", cu, cu, cu_padded, cu_padded)
        yield torch.randint(0, VOCAB, (1, SEQ_LENGTH), generator=g), params


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="http://127.0.0.1:8000")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 64), torch.nn.Linear(64, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    agent = Agent(
        AgentConfig(server=args.server, run_name="megatron-style", log_every=5, parallel={"tp": 1, "pp": 1}),
        model=ModelSpec(layers=4, hidden=64, heads=4, ffn=256, vocab=VOCAB),
    )
    data = batches(torch.Generator().manual_seed(0))

    def forward_step(tokens: torch.Tensor, packed_seq_params: PackedSeqParams) -> torch.Tensor:
        agent.observe_batch(packed_seq_params=packed_seq_params, shape=(1, SEQ_LENGTH))  # first stage only
        logits = model(tokens)
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))

    def train_step() -> None:  # on every rank, every iteration
        agent.step_begin()
        losses = []
        for _ in range(MICRO_BATCHES):  # what forward_backward_func does, without a pipeline
            loss = forward_step(*next(data)) / MICRO_BATCHES
            loss.backward()
            losses.append(loss.detach())
        optimizer.step()
        optimizer.zero_grad()
        agent.step_end(loss=torch.stack(losses).sum(), lr=optimizer.param_groups[0]["lr"])  # never .item() here

    for _ in range(args.steps):
        train_step()
    agent.close()
    print(f"dashboard: {args.server}/runs/{agent.run_id}")


if __name__ == "__main__":
    main()
