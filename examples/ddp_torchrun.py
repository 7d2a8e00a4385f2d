"""The agent on every rank of a DistributedDataParallel run:

    torchrun --nproc-per-node 2 examples/ddp_torchrun.py --server http://127.0.0.1:8000

Every rank creates the agent (its constructor shares rank 0's run id, its only collective) and
sends its own records; the server sums the ranks. gloo on CPU, NCCL on GPUs.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from packscope.agent import Agent, AgentConfig, ModelSpec

PACK_LENGTH, VOCAB = 512, 256


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="http://127.0.0.1:8000")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    model = DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Embedding(VOCAB, 64), torch.nn.Linear(64, VOCAB)).to(device)
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    config = AgentConfig(server=args.server, run_name="ddp-torchrun", log_every=5)
    agent = Agent(config, model=ModelSpec(layers=4, hidden=64, heads=4, ffn=256, vocab=VOCAB), device=device)
    g = torch.Generator().manual_seed(rank)  # each rank its own documents
    for _ in range(args.steps):
        agent.step_begin()
        lengths = torch.randint(16, 200, (8,), generator=g)
        lengths = lengths[lengths.cumsum(0) <= PACK_LENGTH]  # host tensors: no device sync
        cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)]).to(device)
        tokens = torch.randint(0, VOCAB, (1, PACK_LENGTH), generator=g).to(device)
        agent.observe_batch(cu_seqlens=cu_seqlens, shape=(1, PACK_LENGTH))
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        agent.step_end(loss=loss.detach(), lr=optimizer.param_groups[0]["lr"])
    agent.close()
    if rank == 0:
        print(f"dashboard: {args.server}/runs/{agent.run_id}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
