"""The ranks of the multi-process integration tests (tests/agent/test_integrations_ddp.py), run
under torchrun with gloo on CPU:

    python -m torch.distributed.run --nproc-per-node 2 tests/agent/ddp_workers.py hf|lightning URL OUT_DIR

Each rank trains a tiny random model with the packscope callback sending to URL, and writes the
micro-batches its collator built (document lengths per row, and the row length) to
OUT_DIR/rank<r>.json: the brute-force truth the test checks the server's rows against."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch

STEPS, ACCUMULATION, LOG_EVERY, VOCAB = 4, 2, 2, 64


def hf(url: str, out: Path, rank: int) -> tuple[str, list]:
    import datasets
    import transformers

    from packscope.agent.integrations.hf import PackscopeCallback

    g = torch.Generator().manual_seed(7)  # the same examples on every rank; the sampler splits them
    lengths = torch.randint(2, 40, (64,), generator=g).tolist()
    ids = [torch.randint(3, VOCAB, (k,), generator=g).tolist() for k in lengths]
    data = datasets.Dataset.from_dict({"input_ids": ids})
    flatten = transformers.DataCollatorWithFlattening()
    batches: list = []

    def collate(features):
        batches.append(([[len(f["input_ids"]) for f in features]], sum(len(f["input_ids"]) for f in features)))
        return flatten(features)

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256,
    )  # fmt: skip
    callback = PackscopeCallback(server=url, run_name="hf-ddp", spool_dir=str(out / "spool"))
    args = transformers.TrainingArguments(
        output_dir=str(out / "hf"), per_device_train_batch_size=3, gradient_accumulation_steps=ACCUMULATION,
        max_steps=STEPS, logging_steps=LOG_EVERY, report_to=[], use_cpu=True, save_strategy="no",
        disable_tqdm=True, ddp_backend="gloo", dataloader_num_workers=0,
    )  # fmt: skip
    trainer = transformers.Trainer(
        model=transformers.Qwen2ForCausalLM(config), args=args, train_dataset=data, data_collator=collate,
        callbacks=[callback],
    )  # fmt: skip
    trainer.train()
    return callback.agent.run_id, batches[: STEPS * ACCUMULATION]  # the loader may collate one ahead


def lightning(url: str, out: Path, rank: int) -> tuple[str, list]:
    import lightning.pytorch as L

    from packscope.agent.integrations.lightning import PackscopeCallback
    from packscope.core.flops import ModelSpec

    batches: list = []

    def collate(packs: list[list[int]]):  # padded rows of packed documents, position_ids restarting at 0
        batches.append((packs, 32))
        rows = len(packs)
        positions = torch.zeros(rows, 32, dtype=torch.long)
        mask = torch.zeros(rows, 32, dtype=torch.long)
        for r, docs in enumerate(packs):
            start = 0
            for d in docs:
                positions[r, start : start + d] = torch.arange(d)
                start += d
            mask[r, :start] = 1
        return {"input_ids": torch.randint(1, VOCAB, (rows, 32)), "position_ids": positions, "attention_mask": mask}

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Embedding(VOCAB, 16), torch.nn.Linear(16, VOCAB))

        def training_step(self, batch, batch_idx):
            logits = self.net(batch["input_ids"])
            return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), batch["input_ids"].reshape(-1))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(3)
    packs = []
    for _ in range(96):
        docs, room = [], int(torch.randint(8, 33, (1,), generator=g))
        while room > 0:
            docs.append(int(torch.randint(1, room + 1, (1,), generator=g)))
            room -= docs[-1]
        packs.append(docs)
    callback = PackscopeCallback(
        server=url, run_name="lightning-ddp", model=ModelSpec(layers=2, hidden=16, heads=2, ffn=32, vocab=VOCAB),
        spool_dir=str(out / "spool"),
    )  # fmt: skip
    trainer = L.Trainer(
        max_steps=STEPS, accumulate_grad_batches=ACCUMULATION, log_every_n_steps=LOG_EVERY, accelerator="cpu",
        devices=2, strategy="ddp", logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, callbacks=[callback],
    )  # fmt: skip
    loader = torch.utils.data.DataLoader(packs, batch_size=3, collate_fn=collate)
    trainer.fit(Tiny(), loader)
    return callback.agent.run_id, batches[: STEPS * ACCUMULATION]


def main() -> None:
    kind, url, out = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    rank = int(os.environ["RANK"])
    torch.set_num_threads(1)
    run_id, batches = (hf if kind == "hf" else lightning)(url, out, rank)
    (out / f"rank{rank}.json").write_text(json.dumps({"run_id": run_id, "batches": batches}))


if __name__ == "__main__":
    main()
