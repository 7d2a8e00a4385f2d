"""What the Hugging Face callback tells the server about a run's batches: the layout they had (a
padding collator's rows are BSHD, whatever was declared) and, under TRL's packing, the pack length
its baseline counts (TRL's max_length, not the flattened micro-batch); and the run's URL."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
WITHOUT = "the Hugging Face integration's tests need packscope[hf] (transformers, trl, datasets)"
datasets = pytest.importorskip("datasets", reason=WITHOUT)
transformers = pytest.importorskip("transformers", reason=WITHOUT)
trl = pytest.importorskip("trl", reason=WITHOUT)

from packscope.agent.batch_forms import baseline_sq_sum  # noqa: E402
from packscope.agent.integrations.hf import PackscopeCallback  # noqa: E402

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
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _in_a_folder_of_its_own(tmp_path, monkeypatch):
    """The Trainer makes its (relative) output_dir even when it saves nothing: one per test, as
    tests run side by side."""
    monkeypatch.chdir(tmp_path)


def tiny_llama():
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY))


def dataset(n: int = 60, seed: int = 1):
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


class RowLengths:
    """Wraps a collator; keeps each micro-batch's (rows, row length) as the model receives it."""

    def __init__(self, collator):
        self.collator = collator
        self.shapes: list[tuple[int, int]] = []

    def __call__(self, features):
        out = self.collator(features)
        self.shapes.append(tuple(out["input_ids"].shape))
        return out


def sft(callback: PackscopeCallback, *, packing: bool, max_length: int | None, steps: int = 4) -> RowLengths:
    trainer = trl.SFTTrainer(
        model=tiny_llama(),
        processing_class=tokenizer(),
        train_dataset=dataset(),
        args=trl.SFTConfig(
            output_dir="layout-test",
            per_device_train_batch_size=2,
            gradient_accumulation_steps=2,
            max_steps=steps,
            logging_steps=2,
            report_to=[],
            use_cpu=True,
            save_strategy="no",
            disable_tqdm=True,
            packing=packing,
            max_length=max_length,
        ),
        callbacks=[callback],
    )
    recorded = RowLengths(trainer.data_collator)
    trainer.data_collator = recorded
    trainer.train()
    return recorded


def test_a_padding_collator_is_stored_as_bshd():
    cb = PackscopeCallback(run_name="padded")
    sft(cb, packing=False, max_length=None)
    records = list(cb.agent.records)
    assert cb.agent.config.layout is None  # nothing was declared: the batches decide
    assert cb.agent.layout_seen == "bshd"
    assert all(r["real_tokens"] < r["tokens"] for r in records)  # padded rows, counted as such
    assert cb.agent.config.pack_length is None


def test_trl_packing_counts_packs_of_max_length_in_the_baseline():
    cb = PackscopeCallback(run_name="packed")
    recorded = sft(cb, packing=True, max_length=64)
    assert (cb.agent.config.pack_length, cb.agent.config.pack_length_from) == (64, "TRL max_length (packing=True)")
    assert cb.agent.layout_seen == "thd"
    records = list(cb.agent.records)
    trained = recorded.shapes[: 4 * 2]  # 4 steps of 2 micro-batches (the loader may collate ahead)
    assert all(rows == 1 for rows, _ in trained)  # TRL flattens each micro-batch into one row
    assert any(length > 64 for _, length in trained)  # longer than a pack: the case that over-counted
    per_interval = [trained[i : i + 4] for i in range(0, len(trained), 4)]
    for r, shapes in zip(records, per_interval, strict=True):
        assert r["seqlen_sq_sum_bshd"] == sum(baseline_sq_sum(1, n, 64) for _, n in shapes)
        assert r["seqlen_sq_sum_bshd"] < sum(n * n for _, n in shapes)  # not one sequence per row
        assert r["tokens"] == sum(n for _, n in shapes)


@pytest.mark.slow  # the real backend in a thread: the server stack's import
def test_the_server_shows_what_the_batches_were_and_the_run_url_is_printed(tmp_path, capsys):
    from tests.e2e.conftest import Backend, free_port

    backend = Backend(f"sqlite:///{tmp_path / 'layouts.db'}", free_port()).start()
    try:
        padded = PackscopeCallback(server=backend.url, run_name="padded", spool_dir=str(tmp_path / "a"))
        sft(padded, packing=False, max_length=None, steps=2)
        packed = PackscopeCallback(server=backend.url, run_name="packed", spool_dir=str(tmp_path / "b"))
        sft(packed, packing=True, max_length=64, steps=2)
        err = capsys.readouterr().err
        for cb in (padded, packed):
            assert f"packscope: run {cb.agent.run_id}: {backend.url}/runs/{cb.agent.run_id}" in err
        run = backend.get(f"/api/v1/runs/{padded.agent.run_id}")
        assert (run["layout"], run["layout_declared"], run["pack_length"]) == ("bshd", "thd", None)
        assert [r["run_id"] for r in backend.get("/api/v1/runs", layout="bshd")["runs"]] == [padded.agent.run_id]
        run = backend.get(f"/api/v1/runs/{packed.agent.run_id}")
        assert (run["layout"], run["pack_length"], run["pack_length_from"]) == (
            "thd",
            64,
            "TRL max_length (packing=True)",
        )
        assert run["status"] == "finished" and run["heartbeat_s"] == 30.0
    finally:
        backend.stop()
