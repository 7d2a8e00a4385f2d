"""The HF Trainer callback on a GPU with the shapes that once made every step take 9-33 s on an
H100 (issue 34): a model with a sliding window and a vision-language model with images, packed
with restarting position_ids, offline (spooled, as a run without a server). The callback's
records on CUDA equal what an agent on the CPU counts from the same micro-batches; its cost is
bench/integration_overhead.py's (`--model mistral-303m-window`, `--model qwen25vl-303m`).

Run on the GPU machine: ``python -m pytest -m gpu tests/gpu``.
"""

from __future__ import annotations

import os
import random

import pytest
import torch

transformers = pytest.importorskip("transformers")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from packscope.agent import Agent, AgentConfig  # noqa: E402
from packscope.agent.integrations.batches import image_kwargs, observe_kwargs  # noqa: E402
from packscope.agent.integrations.hf import PackscopeCallback  # noqa: E402
from packscope.core.hf_config import spec_from_hf_config  # noqa: E402

pytestmark = pytest.mark.gpu

VOCAB = 256
IMAGE, START, END = 255, 254, 253  # Qwen2.5-VL's image and vision start/end tokens, in the tiny vocabulary
GRID = (1, 4, 4)  # one frame of 4x4 patches: 4 tokens after the 2x2 merge
STEPS, LOG_EVERY, ACCUMULATION = 10, 5, 2
TEXT = dict(
    vocab_size=VOCAB,
    hidden_size=64,
    intermediate_size=128,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=4096,
)


def tiny_model(kind: str):
    torch.manual_seed(0)
    if kind == "window":
        return transformers.MistralForCausalLM(transformers.MistralConfig(**TEXT, sliding_window=32))
    config = transformers.Qwen2_5_VLConfig(
        text_config={**TEXT, "rope_scaling": {"type": "mrope", "mrope_section": [2, 3, 3]}},
        vision_config=dict(depth=1, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64),
        image_token_id=IMAGE, vision_start_token_id=START, vision_end_token_id=END,
    )  # fmt: skip
    return transformers.Qwen2_5_VLForConditionalGeneration(config)


class Packed:
    """The micro-batch's examples back to back in one row, position_ids restarting at each; for
    the vision model each example opens with one image. Keeps every micro-batch it made."""

    def __init__(self, images: bool):
        self.images = images
        self.made: list[dict] = []

    def __call__(self, features):
        ids, labels, positions = [], [], []
        for f in features:
            head = [START, *[IMAGE] * (GRID[0] * GRID[1] * GRID[2] // 4), END] if self.images else []
            doc = head + f["input_ids"]
            ids += doc
            labels += [-100] * (len(head) + 1) + f["input_ids"][1:]
            positions += range(len(doc))
        batch = {
            "input_ids": torch.tensor([ids]),
            "labels": torch.tensor([labels]),
            "position_ids": torch.tensor([positions]),
        }
        if self.images:
            batch["pixel_values"] = torch.randn(len(features) * GRID[0] * GRID[1] * GRID[2], 3 * 2 * 14 * 14)
            batch["image_grid_thw"] = torch.tensor([GRID] * len(features))
        self.made.append(batch)
        return batch


def examples(n: int) -> list[dict]:
    rng = random.Random(0)
    return [{"input_ids": [rng.randrange(2, 250) for _ in range(rng.randint(8, 120))]} for _ in range(n)]


def cpu_records(spec, batches: list[dict]) -> list[dict]:
    """What an agent on the CPU counts when it observes `batches` step by step, as the callback does."""
    agent = Agent(AgentConfig(server=None, log_every=LOG_EVERY, count_syncs=False, sample_gpu=False), model=spec)
    for step in range(STEPS):
        agent.step_begin()
        for batch in batches[step * ACCUMULATION : (step + 1) * ACCUMULATION]:
            agent.observe_batch(**observe_kwargs(batch), **image_kwargs(batch, spec.vision))
        agent.step_end()
    agent.close()
    return list(agent.records)


COUNTED = (
    "tokens",
    "packs",
    "real_tokens",
    "documents",
    "seqlen_sq_sum_bshd",
    "seqlen_sq_sum_thd",
    "flops_bshd",
    "flops_thd",
)


def counts(record: dict) -> dict:
    """The record's counts: every integer or float that is no reading of time, power or memory."""
    kept = {k: record[k] for k in COUNTED}
    kept.update({k: v for k, v in record.items() if k.startswith(("attention", "vision", "flops_"))})
    kept["histograms"] = record["histograms"]
    return kept


@pytest.mark.parametrize("kind", ["window", "vision"])
def test_the_callback_counts_windowed_and_vision_batches_on_cuda_as_the_cpu_does(kind, tmp_path):
    model = tiny_model(kind)
    collator = Packed(images=kind == "vision")
    callback = PackscopeCallback(server=None, spool_dir=str(tmp_path), run_name=f"gpu-{kind}")
    trainer = transformers.Trainer(
        model=model,
        args=transformers.TrainingArguments(
            output_dir=str(tmp_path / "out"), max_steps=STEPS, per_device_train_batch_size=4,
            gradient_accumulation_steps=ACCUMULATION, logging_steps=LOG_EVERY, report_to=[], save_strategy="no",
            bf16=True, disable_tqdm=True, remove_unused_columns=False, dataloader_num_workers=0,
        ),
        train_dataset=examples(4 * ACCUMULATION * (STEPS + 2)), data_collator=collator, callbacks=[callback],
    )  # fmt: skip
    trainer.train()
    spec = spec_from_hf_config(model.config)
    assert (spec.vision is not None) == (kind == "vision") and (spec.window == 32) == (kind == "window")
    on_gpu = list(callback.agent.records)
    assert [(r["first_step"], r["last_step"]) for r in on_gpu] == [(1, 5), (6, 10)]
    # The loader may collate a batch ahead: the first ones are those trained.
    on_cpu = cpu_records(spec, collator.made[: STEPS * ACCUMULATION])
    assert [counts(r) for r in on_gpu] == [counts(r) for r in on_cpu]
    assert all(r["flops_thd"] > 0 for r in on_gpu)
