"""PackscopeCallback in the Hugging Face Trainer and TRL's SFTTrainer, on CPU with tiny random
models: every interval's counts equal a brute-force computation over the micro-batches the
collator really produced (recorded by wrapping the collator, from the examples it was given),
grouped into optimizer steps as the Trainer does."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
import functools
import operator

from torch.utils._python_dispatch import TorchDispatchMode

WITHOUT = "the Hugging Face integration's tests need packscope[hf] (transformers, trl, datasets)"
datasets = pytest.importorskip("datasets", reason=WITHOUT)
transformers = pytest.importorskip("transformers", reason=WITHOUT)
trl = pytest.importorskip("trl", reason=WITHOUT)

# transformers and trl import lazily: pay for it at collection, not inside the first test's time.
from transformers import LlamaForCausalLM, Qwen2ForCausalLM, Trainer  # noqa: E402, F401
from trl import SFTTrainer  # noqa: E402, F401

from packscope.agent.histograms import NUM_BUCKETS, bucket_of  # noqa: E402
from packscope.agent.integrations.hf import PackscopeCallback  # noqa: E402
from packscope.core.hf_config import spec_from_hf_config  # noqa: E402

AGENT_DIR = Path(__file__).resolve().parents[2] / "agent"
VOCAB = 64
TINY = dict(
    vocab_size=VOCAB,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


@pytest.fixture(autouse=True)
def _one_intra_op_thread():
    # On a loaded 2-core machine a wide intra-op pool makes these tiny models 10x slower.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _in_a_folder_of_its_own(tmp_path, monkeypatch):
    """The Trainer makes its (relative) output_dir even when it saves nothing: one per test, as
    tests run side by side."""
    monkeypatch.chdir(tmp_path)


def tiny_model(kind: str):
    torch.manual_seed(0)
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY))
    return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(**TINY))


def dataset(n: int = 48, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(2, 40, (n,), generator=g).tolist()
    return datasets.Dataset.from_dict(
        {"input_ids": [torch.randint(3, VOCAB, (k,), generator=g).tolist() for k in lengths]}
    )


def tokenizer():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    vocab = {"<pad>": 0, **{f"t{i}": i for i in range(1, VOCAB)}}
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(WordLevel(vocab, unk_token="t1")), pad_token="<pad>", eos_token="t2"
    )


class Recorded:
    """Wraps a collator; keeps, per micro-batch, its packs (rows) as lists of document lengths
    taken from the examples the collator was given, and the row length it produced."""

    def __init__(self, collator, flattens: bool):
        self.collator = collator
        self.flattens = flattens
        self.batches: list[tuple[list[list[int]], int]] = []

    def __call__(self, features):
        out = self.collator(features)
        docs = [f.get("seq_lengths") or [len(f["input_ids"])] for f in features]
        rows = [functools.reduce(operator.iadd, docs, [])] if self.flattens else docs
        self.batches.append((rows, out["input_ids"].shape[1]))
        return out


def brute(batches: list[tuple[list[list[int]], int]]) -> dict:
    docs = [d for rows, _ in batches for row in rows for d in row]
    hist = [0] * NUM_BUCKETS
    for d in docs:
        hist[bucket_of(d)] += 1
    return {
        "tokens": sum(len(rows) * n for rows, n in batches),
        "packs": sum(len(rows) for rows, _ in batches),
        "real_tokens": sum(docs),
        "documents": len(docs),
        "seqlen_sq_sum_bshd": sum(len(rows) * n * n for rows, n in batches),
        "seqlen_sq_sum_thd": sum(d * d for d in docs),
        "doc_hist": hist,
    }


def counted(record: dict) -> dict:
    keys = ("tokens", "packs", "real_tokens", "documents", "seqlen_sq_sum_bshd", "seqlen_sq_sum_thd")
    return {**{k: record[k] for k in keys}, "doc_hist": record["histograms"]["documents"]["count"]}


def check_intervals(
    records: list[dict], recorded: Recorded, spec, accumulation: int, log_every: int, steps: int
) -> None:
    # The dataloader may collate one batch ahead of training; the first ones are those trained.
    assert len(recorded.batches) >= steps * accumulation
    per_interval = log_every * accumulation
    assert [(r["first_step"], r["last_step"]) for r in records] == [
        (s + 1, min(s + log_every, steps)) for s in range(0, steps, log_every)
    ]
    for i, r in enumerate(records):
        trained = recorded.batches[i * per_interval : min((i + 1) * per_interval, steps * accumulation)]
        assert counted(r) == brute(trained)
        assert r["flops_thd"] == spec.flops(r["tokens"], r["seqlen_sq_sum_thd"])


def train(
    model,
    collator,
    *,
    accumulation=2,
    steps=4,
    logging_steps=2,
    trainer_cls=None,
    args_cls=None,
    callback: PackscopeCallback | None = None,
    **trainer_kwargs,
):
    args_cls = args_cls or transformers.TrainingArguments
    args = args_cls(
        output_dir="hf-test",
        per_device_train_batch_size=3,
        gradient_accumulation_steps=accumulation,
        max_steps=steps,
        logging_steps=logging_steps,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
        **trainer_kwargs.pop("args", {}),
    )
    callback = callback or PackscopeCallback(run_name="hf-test")
    trainer = (trainer_cls or transformers.Trainer)(
        model=model, args=args, data_collator=collator, callbacks=[callback], **trainer_kwargs
    )
    trainer.train()
    assert callback.agent.model == spec_from_hf_config(model.config)
    return trainer, callback


@pytest.mark.parametrize("kind, flash_kwargs", [("llama", False), ("qwen2", True)])
def test_flattening_collator_is_counted_exactly(kind, flash_kwargs):
    # position_ids only, or cu_seq_lens_q/max_length_q as well (return_flash_attn_kwargs).
    recorded = Recorded(transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=flash_kwargs), flattens=True)
    model = tiny_model(kind)
    trainer, cb = train(model, recorded, train_dataset=dataset())
    records = list(cb.agent.records)
    check_intervals(records, recorded, cb.agent.model, accumulation=2, log_every=2, steps=4)
    assert all(r["documents"] > r["packs"] for r in records)  # really packed
    # The loss is assembled on the device from the model's outputs: equal to what the Trainer logs.
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert [r["loss"] for r in records] == pytest.approx(logged, rel=1e-5)
    assert [r["lr"] for r in records] == pytest.approx(
        [h["learning_rate"] for h in trainer.state.log_history if "loss" in h]
    )


def test_an_interval_longer_than_the_kept_micro_batches_is_counted_exactly():
    """24 micro-batches an interval: the callback observes its kept forwards once 16 are kept
    (batches.PENDING_FORWARDS), again at the boundary, and the partial last interval at close."""
    recorded = Recorded(transformers.DataCollatorWithFlattening(), flattens=True)
    trainer, cb = train(tiny_model("llama"), recorded, steps=14, logging_steps=12, train_dataset=dataset(96))
    records = list(cb.agent.records)
    check_intervals(records, recorded, cb.agent.model, accumulation=2, log_every=12, steps=14)
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert records[0]["loss"] == pytest.approx(logged[0], rel=1e-5)


def test_padded_rows_are_counted_from_the_attention_mask():
    collator = trl.trainer.sft_trainer.DataCollatorForLanguageModeling(pad_token_id=0)
    recorded = Recorded(collator, flattens=False)
    _, cb = train(tiny_model("llama"), recorded, accumulation=3, steps=3, logging_steps=2, train_dataset=dataset())
    records = list(cb.agent.records)
    check_intervals(records, recorded, cb.agent.model, accumulation=3, log_every=2, steps=3)
    assert all(r["documents"] == r["packs"] and r["real_tokens"] < r["tokens"] for r in records)


def test_eval_forwards_are_not_counted():
    recorded = Recorded(transformers.DataCollatorWithFlattening(), flattens=True)
    evaluation = datasets.Dataset.from_dict({"input_ids": [[5] * 41] * 4})  # longer than any training example
    _, cb = train(
        tiny_model("llama"),
        recorded,
        steps=2,
        train_dataset=dataset(),
        eval_dataset=evaluation,
        args={"eval_strategy": "steps", "eval_steps": 1},
    )
    # Evaluation collates through the same collator and runs the same model in eval mode.
    assert any(41 in b[0][0] for b in recorded.batches)
    trained = [b for b in recorded.batches if 41 not in b[0][0]][:4]
    assert sum(r["documents"] for r in cb.agent.records) == brute(trained)["documents"]
    assert sum(r["tokens"] for r in cb.agent.records) == brute(trained)["tokens"]


def test_ordinary_steps_read_nothing_back(monkeypatch):
    """No .item()/.tolist()/bool()/float() on a tensor from agent code, except where an interval's
    host copy is read: the step after its boundary (the boundary of step 3 is reduced in step 4's
    first forward, its copy read when step 4 ends) and close."""
    reads: list[tuple[int, str]] = []
    cb = PackscopeCallback(run_name="no-reads", log_every=3)

    def spy(name):
        original = getattr(torch.Tensor, name)

        def read(self, *args, **kwargs):
            frame = sys._getframe(1)
            if frame.f_code.co_filename.startswith(str(AGENT_DIR)) and cb.agent is not None:
                reads.append((cb.agent.step, name))
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, read)

    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "cpu", "numpy"):
        spy(name)
    recorded = Recorded(transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=False), flattens=True)
    train(tiny_model("qwen2"), recorded, steps=5, callback=cb, train_dataset=dataset())
    monkeypatch.undo()
    assert len(cb.agent.records) == 2
    assert reads, "the spy saw no read at all: it would not see one on an ordinary step either"
    assert {step for step, _ in reads} <= {4, 5}, reads  # the boundary's copy (4) and close (5) only


# -- TRL SFTTrainer ---------------------------------------------------------------------------
def sft(model, *, packing: bool, padding_free: bool, callback: PackscopeCallback, steps=4):
    trainer = trl.SFTTrainer(
        model=model,
        processing_class=tokenizer(),
        train_dataset=dataset(60),
        args=trl.SFTConfig(
            output_dir="sft-test",
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            max_steps=steps,
            logging_steps=2,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            disable_tqdm=True,
            packing=packing,
            padding_free=padding_free,
            max_length=64 if packing else None,
        ),  # TRL refuses a max_length it would not enforce
        callbacks=[callback],
    )
    # SFTTrainer builds its collator; wrap that one. Padding-free flattens every example into one row.
    recorded = Recorded(trainer.data_collator, flattens=packing or padding_free)
    trainer.data_collator = recorded
    trainer.train()
    assert callback.agent.model == spec_from_hf_config(model.config)
    return trainer, recorded


def test_sft_trainer_padding_free_without_packing():
    cb = PackscopeCallback(run_name="sft-padding-free")
    trainer, recorded = sft(tiny_model("qwen2"), packing=False, padding_free=True, callback=cb)
    check_intervals(list(cb.agent.records), recorded, cb.agent.model, accumulation=2, log_every=2, steps=4)
    logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    assert [r["loss"] for r in cb.agent.records] == pytest.approx(logged, rel=1e-5)


@pytest.mark.slow  # starts the real backend (imports the server stack): about 13 s here
def test_sft_trainer_with_packing_reaches_a_live_backend(tmp_path):
    from tests.e2e.conftest import Backend, free_port

    backend = Backend(f"sqlite:///{tmp_path / 'hf.db'}", free_port()).start()
    try:
        cb = PackscopeCallback(
            server=backend.url,
            run_name="sft-packed",
            project="hf",
            spool_dir=str(tmp_path / "spool"),
            pack_length=None,  # a pack per flattened row, as brute() counts (max_length: test_integration_layouts)
        )
        trainer, recorded = sft(tiny_model("llama"), packing=True, padding_free=False, callback=cb)
        records = list(cb.agent.records)
        check_intervals(records, recorded, cb.agent.model, accumulation=2, log_every=2, steps=4)
        logged = [h["loss"] for h in trainer.state.log_history if "loss" in h]
        assert [r["loss"] for r in records] == pytest.approx(logged, rel=1e-5)
        assert all(r["documents"] > r["packs"] for r in records)
        run = backend.get(f"/api/v1/runs/{cb.agent.run_id}")
        assert run["status"] == "finished" and run["name"] == "sft-packed" and run["records"] == 2
        assert run["model"] == cb.agent.model.to_dict()
        rows = backend.csv_rows(cb.agent.run_id)
        assert [int(row["seqlen_sq_sum_thd"]) for row in rows] == [r["seqlen_sq_sum_thd"] for r in records]
        assert [int(row["tokens"]) for row in rows] == [r["tokens"] for r in records]
    finally:
        backend.stop()


@pytest.mark.slow  # a fresh interpreter imports torch: up to 20 s on a loaded machine
def test_the_agent_imports_no_training_library():
    code = (
        "import sys, packscope.agent, packscope.agent.integrations.batches; "
        "print(' '.join(m for m in sys.modules if m.split('.')[0] in "
        "('transformers', 'trl', 'datasets', 'lightning', 'pytorch_lightning')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == ""


class CountOps(TorchDispatchMode):
    """The ATen ops that compute (not views) run while it is active."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize(
    "collator, flattens",
    [
        (transformers.DataCollatorWithFlattening(), True),  # position_ids
        (transformers.DataCollatorWithFlattening(return_flash_attn_kwargs=True), True),  # cu_seq_lens_q
        (trl.trainer.sft_trainer.DataCollatorForLanguageModeling(pad_token_id=0), False),  # attention_mask
    ],
    ids=["position_ids", "cu_seqlens", "attention_mask"],
)
def test_an_ordinary_step_runs_no_op_in_the_callback(collator, flattens):
    """Nothing the callback does between log boundaries launches a kernel, and the boundary's
    chain runs in the next step's first forward hook (the GPU busy), not when the boundary step
    ends (the GPU idle after the Trainer's NaN check): every hook and callback method runs under
    an op counter, for each batch form."""
    cb = PackscopeCallback(run_name="no-ops", log_every=3)
    ops: dict[tuple[int, str], int] = {}
    forwards: list[int] = []  # the agent's step of each training forward, in order

    def counted(fn, name):
        def call(*args, **kwargs):
            with CountOps() as counter:
                out = fn(*args, **kwargs)
            step = cb.agent.step if cb.agent is not None else 0
            where = name
            if name == "_keep_forward":  # which of the step's forwards
                forwards.append(step)
                where = f"{name} {forwards.count(step)}"
            if counter.count:
                ops[step, where] = ops.get((step, where), 0) + counter.count
            return out

        return call

    for name in ("on_step_begin", "on_optimizer_step", "on_step_end", "_keep_forward"):
        setattr(cb, name, counted(getattr(cb, name), name))
    recorded = Recorded(collator, flattens=flattens)
    train(tiny_model("qwen2"), recorded, steps=5, callback=cb, train_dataset=dataset())
    # The boundary's one chain, in the first of step 4's two forwards, and nothing else.
    assert list(ops) == [(4, "_keep_forward 1")], ops
    assert forwards.count(4) == 2
    check_intervals(list(cb.agent.records), recorded, cb.agent.model, accumulation=2, log_every=3, steps=5)


def test_without_a_server_the_run_is_kept_for_packscope_sync(tmp_path):
    import sqlite3

    cb = PackscopeCallback(server=None, spool_dir=str(tmp_path / "runs"), run_name="hf-offline")
    train(tiny_model("llama"), transformers.DataCollatorWithFlattening(), steps=4, callback=cb, train_dataset=dataset())
    db = sqlite3.connect(tmp_path / "runs" / f"{cb.agent.run_id}.sqlite")
    try:
        spooled = [json.loads(body) for (body,) in db.execute("SELECT body FROM records ORDER BY id")]
        meta = dict(db.execute("SELECT key, value FROM meta"))
    finally:
        db.close()
    assert spooled == list(cb.agent.records) and len(spooled) == 2  # every record, as the agent made it
    assert json.loads(meta["run"])["name"] == "hf-offline" and json.loads(meta["final"])["status"] == "finished"


GRID = (1, 4, 4)  # one image of 4x4 patches a document: 4 tokens after Qwen2.5-VL's 2x2 merge


class WithImages:
    """Each example back to back in one row (position_ids restarting), opened by one image: its
    pixel patches and its `image_grid_thw` row. Keeps the grids of every micro-batch it made."""

    image, start, end = VOCAB - 1, VOCAB - 2, VOCAB - 3

    def __init__(self) -> None:
        self.grids: list[list[tuple[int, int, int]]] = []

    def __call__(self, features):
        ids, labels, positions = [], [], []
        for f in features:
            text = [min(t, self.end - 1) for t in f["input_ids"]]  # below the vision tokens
            doc = [self.start, *[self.image] * (GRID[1] * GRID[2] // 4), self.end, *text]
            ids += doc
            labels += [-100] * (len(doc) - len(text) + 1) + text[1:]
            positions += range(len(doc))
        self.grids.append([GRID] * len(features))
        return {
            "input_ids": torch.tensor([ids]),
            "labels": torch.tensor([labels]),
            "position_ids": torch.tensor([positions]),
            "pixel_values": torch.randn(len(features) * GRID[1] * GRID[2], 3 * 2 * 14 * 14),
            "image_grid_thw": torch.tensor([GRID] * len(features)),
        }


def test_a_vision_batchs_images_are_kept_as_shapes_and_its_steps_wait_for_the_boundary():
    """Kept micro-batches hold no image past their step (meta tensors of the images' shapes), so a
    vision model's steps are observed together at the boundary as a text model's are, not one by
    one (on an H100 that per-step work cost 0.05% of step time); the counts are exact."""
    from packscope.core.vision import VISION_SUMS, batch_sums

    torch.manual_seed(0)
    model = transformers.Qwen2_5_VLForConditionalGeneration(
        transformers.Qwen2_5_VLConfig(
            text_config={**TINY, "rope_scaling": {"type": "mrope", "mrope_section": [2, 1, 1]}},
            vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32),
            image_token_id=WithImages.image,
            vision_start_token_id=WithImages.start,
            vision_end_token_id=WithImages.end,
        )
    )
    cb = PackscopeCallback(run_name="hf-vision", log_every=2)
    kept_images: list[str] = []  # the device of every kept micro-batch's pixel_values
    observed_at: list[int] = []  # the agent's step when each ended step was observed
    observe = cb._pending._observe_step  # what PendingSteps calls for each ended step

    def observe_step(forwards):
        kept_images.extend(kwargs["pixel_values"].device.type for _, kwargs, _ in forwards)
        observed_at.append(cb.agent.step)
        observe(forwards)

    cb._pending._observe_step = observe_step
    collator = WithImages()
    train(
        model,
        collator,
        steps=4,
        logging_steps=2,
        callback=cb,
        args={"remove_unused_columns": False},
        train_dataset=dataset(),
    )
    assert kept_images == ["meta"] * 8  # 4 steps of 2 micro-batches
    assert len(set(observed_at)) < len(observed_at), observed_at  # steps observed together, not each at its end
    records = list(cb.agent.records)
    for i, record in enumerate(records):
        grids = [g for batch in collator.grids[i * 4 : (i + 1) * 4] for g in batch]  # 2 steps x 2 micro-batches
        expected = batch_sums(cb.agent.model.vision, grids)
        assert {k: record[k] for k in VISION_SUMS} == {k: expected[k] for k in VISION_SUMS}


@pytest.mark.parametrize("name", ["gemma3n_text", "gemma4_text", "gemma4_text_moe"])
def test_a_gemma_decoder_is_counted_by_the_callback_from_its_structure(name):
    """Gemma 3n and Gemma 4, which no hand-written reader reads: the callback takes the structural
    count from model.config (the one packscope flops gives for the same file), and each interval's
    FLOPs are that model's on the documents the collator packed, sliding windows included."""
    from packscope.agent.hf_structure import spec_from_structure
    from packscope.core.attention import attention_sums
    from tests.agent.structural_configs import STRUCTURAL

    cfg = {**STRUCTURAL[name], "vocab_size": VOCAB, "vocab_size_per_layer_input": VOCAB}
    config = transformers.AutoConfig.for_model(**cfg)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config)
    recorded = Recorded(transformers.DataCollatorWithFlattening(), flattens=True)
    args = transformers.TrainingArguments(
        output_dir="hf-test",
        per_device_train_batch_size=3,
        gradient_accumulation_steps=2,
        max_steps=4,
        logging_steps=2,
        report_to=[],
        use_cpu=True,
        save_strategy="no",
        disable_tqdm=True,
    )
    callback = PackscopeCallback(run_name="hf-test")
    Trainer(model=model, args=args, data_collator=recorded, callbacks=[callback], train_dataset=dataset()).train()
    spec = spec_from_structure(cfg)
    assert callback.agent.model == spec and spec.window == cfg["sliding_window"]
    records = list(callback.agent.records)
    assert len(records) == 2
    for i, r in enumerate(records):
        trained = recorded.batches[i * 4 : (i + 1) * 4]
        assert counted(r) == brute(trained)
        docs = [row for rows, _ in trained for row in rows]
        sums = dict.fromkeys(attention_sums([[1]], window=spec.window), 0)
        for rows, n in trained:  # each micro-batch's own row length (the BSHD view)
            for key, value in attention_sums(rows, n, window=spec.window).items():
                sums[key] += value
        expected = spec.triad_by_kind(r["tokens"], r["real_tokens"], sums)
        assert (r["flops_thd"], r["flops_bshd"]) == (float(expected["thd"]), float(expected["bshd"])), docs
