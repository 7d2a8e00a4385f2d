"""PyTorch Lightning with packscope: one callback.

    python examples/lightning_module.py --server http://127.0.0.1:8000

Dict batches are read by their keys: here `cu_seqlens` (documents packed into one row) with the
shape of `input_ids`; `position_ids` or a 2-D `attention_mask` work the same way, and
`batch_to_form=` reads any other batch. Intervals follow `log_every_n_steps`.
"""

from __future__ import annotations

import argparse

import lightning.pytorch as L
import torch

from packscope.agent import ModelSpec
from packscope.agent.integrations.lightning import PackscopeCallback

PACK_LENGTH, VOCAB = 512, 256


class Packs(torch.utils.data.IterableDataset):
    """Packs of synthetic documents: tokens and their cu_seqlens."""

    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        while True:
            lengths = torch.randint(16, 200, (8,), generator=g)
            lengths = lengths[lengths.cumsum(0) <= PACK_LENGTH]
            cu_seqlens = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
            yield {"input_ids": torch.randint(0, VOCAB, (1, PACK_LENGTH), generator=g), "cu_seqlens": cu_seqlens}


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 64), torch.nn.Linear(64, VOCAB))

    def training_step(self, batch, batch_idx):
        tokens = batch["input_ids"]
        logits = self.net(tokens)
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, VOCAB), tokens[:, 1:].reshape(-1))

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="http://127.0.0.1:8000")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    callback = PackscopeCallback(
        server=args.server, run_name="lightning", model=ModelSpec(layers=4, hidden=64, heads=4, ffn=256, vocab=VOCAB)
    )
    trainer = L.Trainer(
        max_steps=args.steps, accumulate_grad_batches=2, log_every_n_steps=5, accelerator="auto", devices=1,
        logger=False, enable_checkpointing=False, enable_progress_bar=False, callbacks=[callback],
    )  # fmt: skip
    # batch_size=None: each item is already a batch; the loader only moves it.
    trainer.fit(Tiny(), torch.utils.data.DataLoader(Packs(), batch_size=None))
    print(f"dashboard: {args.server}/runs/{callback.agent.run_id}")


if __name__ == "__main__":
    main()
