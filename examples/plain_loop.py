"""The agent in a plain PyTorch loop: four calls (docs/agent.md).

    python examples/plain_loop.py --server http://127.0.0.1:8000
    python examples/plain_loop.py --offline runs/       # no server: kept in runs/, then
    packscope sync runs/ --server http://127.0.0.1:8000

A tiny model trains on packed synthetic documents (THD: one row of documents back to back, their
boundaries in cu_seqlens). `ModelSpec` describes the transformer whose FLOPs the dashboard counts;
for a Hugging Face model use `read_hf_config("config.json")` instead.
"""

from __future__ import annotations

import argparse

import torch

from packscope.agent import Agent, AgentConfig, ModelSpec

PACK_LENGTH, VOCAB = 1024, 256


def packed_batch(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """One pack of documents of random lengths: the tokens and their cu_seqlens."""
    lengths = []
    while sum(lengths) < PACK_LENGTH:
        lengths.append(min(int(torch.randint(16, 400, (1,), generator=g)), PACK_LENGTH - sum(lengths)))
    cu_seqlens = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    return torch.randint(0, VOCAB, (1, PACK_LENGTH), generator=g), cu_seqlens


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="http://127.0.0.1:8000")
    ap.add_argument("--offline", metavar="DIR", help="no server: keep the run in DIR for `packscope sync`")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    model = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 64), torch.nn.Linear(64, VOCAB))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    spec = ModelSpec(layers=4, hidden=64, heads=4, ffn=256, vocab=VOCAB)  # the FLOPs model
    config = AgentConfig(
        server=None if args.offline else args.server, spool_dir=args.offline, run_name="plain-loop", log_every=5
    )
    g = torch.Generator().manual_seed(0)
    with Agent(config, model=spec) as agent:  # a crash inside marks the run failed
        for _ in range(args.steps):
            agent.step_begin()
            tokens, cu_seqlens = packed_batch(g)
            agent.observe_batch(cu_seqlens=cu_seqlens, shape=tuple(tokens.shape))
            logits = model(tokens)
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            agent.step_end(loss=loss.detach(), lr=optimizer.param_groups[0]["lr"])  # a tensor: never read here
    if args.offline:
        print(f"offline run {agent.run_id}: send it with `packscope sync {args.offline} --server URL`")
    else:
        print(f"dashboard: {args.server}/runs/{agent.run_id}")


if __name__ == "__main__":
    main()
