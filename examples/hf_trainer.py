"""The Hugging Face Trainer with packscope: one callback.

    python examples/hf_trainer.py --server http://127.0.0.1:8000 --collator flattening
    python examples/hf_trainer.py --server http://127.0.0.1:8000 --collator padded

A tiny random Qwen2 (no download) trains on synthetic examples. With `flattening`
(DataCollatorWithFlattening) every micro-batch is one row of examples back to back, restarting
position_ids: the agent counts each example as a document. With `padded` every example is its
own padded row: the agent counts it from the attention mask. The FLOPs model comes from
`model.config`; the intervals follow `logging_steps`.
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import transformers
from tokenizers import Tokenizer
from tokenizers.models import WordLevel

from packscope.agent.integrations.hf import PackscopeCallback

VOCAB = 128


def tiny_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A word-level tokenizer made in code (a real run loads its own)."""
    words = {"<pad>": 0, "<eos>": 1, **{f"w{i}": i for i in range(2, VOCAB)}}
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(words, unk_token="w2")), pad_token="<pad>", eos_token="<eos>"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--server", default="http://127.0.0.1:8000")
    ap.add_argument("--collator", choices=["flattening", "padded"], default="flattening")
    ap.add_argument("--steps", type=int, default=20)
    args = ap.parse_args()

    rng = random.Random(0)
    examples = [{"input_ids": [rng.randrange(2, VOCAB) for _ in range(rng.randint(8, 120))]} for _ in range(512)]
    if args.collator == "flattening":
        collator = transformers.DataCollatorWithFlattening()
    else:
        collator = transformers.DataCollatorForLanguageModeling(tiny_tokenizer(), mlm=False)
    config = transformers.Qwen2Config(
        vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
    )  # fmt: skip
    callback = PackscopeCallback(server=args.server, run_name=f"hf-{args.collator}")
    trainer = transformers.Trainer(
        model=transformers.Qwen2ForCausalLM(config),
        args=transformers.TrainingArguments(
            output_dir=tempfile.mkdtemp(prefix="hf-example-"),
            per_device_train_batch_size=4,
            gradient_accumulation_steps=2,
            max_steps=args.steps,
            logging_steps=5,
            report_to=[],
            save_strategy="no",
            disable_tqdm=True,
        ),
        train_dataset=examples,
        data_collator=collator,
        callbacks=[callback],
    )
    trainer.train()
    print(f"dashboard: {args.server}/runs/{callback.agent.run_id}")


if __name__ == "__main__":
    main()
