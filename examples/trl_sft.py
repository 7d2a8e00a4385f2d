"""TRL's SFTTrainer with packing and packscope: the same callback as the Trainer's.

    python examples/trl_sft.py --server http://127.0.0.1:8000

`packing=True` packs examples into rows of `max_length` tokens with their boundaries in
`cu_seq_lens_q`; the agent keeps those and counts every document at the log boundary (no work on
ordinary steps). A tiny random Llama and a word-level tokenizer made in code: nothing is
downloaded.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import datasets
import torch
import transformers
import trl
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from packscope.agent.integrations.hf import PackscopeCallback

VOCAB = 128


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="http://127.0.0.1:8000")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    words = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    tokenizer = transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(words, unk_token="w2")), pad_token="<pad>", eos_token="<eos>"
    )
    rng = random.Random(0)
    data = datasets.Dataset.from_dict(
        {"input_ids": [[rng.randrange(2, VOCAB) for _ in range(rng.randint(8, 120))] for _ in range(512)]}
    )
    config = transformers.LlamaConfig(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
    )  # fmt: skip
    callback = PackscopeCallback(server=args.server, run_name="trl-sft-packed")
    trainer = trl.SFTTrainer(
        model=transformers.LlamaForCausalLM(config),
        processing_class=tokenizer,
        train_dataset=data,
        args=trl.SFTConfig(
            output_dir=tempfile.mkdtemp(prefix="trl-example-"),
            packing=True,
            max_length=256,
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            max_steps=args.steps,
            logging_steps=5,
            report_to=[],
            save_strategy="no",
            disable_tqdm=True,
            bf16=torch.cuda.is_available(),  # TRL's default, which a CPU lacks
        ),
        callbacks=[callback],
    )
    trainer.train()
    print(f"dashboard: {args.server}/runs/{callback.agent.run_id}")


if __name__ == "__main__":
    main()
