"""What the HF Trainer and Lightning callbacks add to the trainer's own logs
(agent/integrations/trainer_logs.py): useful TFLOP/s, useful MFU and the largest loss, each equal
to a computation from the agent's own records' FLOPs fields (the model's triad, not the
catalogue's path), present before the reporting callbacks see the logs, absent when turned off;
on CPU with tiny models. That no ordinary step runs an op is tests/agent/test_integrations_*'s."""

from __future__ import annotations

import pytest
import torch
from wire_records import packed_interval

from packscope.agent.integrations.trainer_logs import fields_of, log_values, padding_share
from packscope.core import ledger
from packscope.core.catalogue import Coefficients, sums_of_rows
from packscope.core.flops import ModelSpec

SPEC = ModelSpec(layers=2, hidden=16, heads=2, ffn=32, vocab=64)
PEAK = 100.0  # TFLOP/s: a made-up peak, so that a CPU run has an MFU to log


@pytest.fixture(autouse=True)
def _one_intra_op_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def by_hand(records: list[dict], dense: bool) -> dict[str, float]:
    """From the records' own FLOPs fields (the agent's triad at the boundary) and GPU time."""
    useful = sum(r["flops_useful"] for r in records)
    computed = sum(r["flops_bshd" if dense else "flops_thd"] for r in records)
    seconds = sum(r["gpu_time_s"] * r["gpus"] for r in records)
    return {"tflops": useful / seconds / 1e12, "padding_pct": 100 * (computed - useful) / computed}


def triad_records(spec: ModelSpec, **kwargs) -> list[dict]:
    records = [packed_interval(k, **kwargs) for k in range(3)]
    for r in records:  # the FLOPs fields as the agent computes them (packed_interval's are placeholders)
        r["flops_bshd"] = float(spec.flops(r["tokens"], r["seqlen_sq_sum_bshd"]))
        r["flops_thd"] = float(spec.flops(r["tokens"], r["seqlen_sq_sum_thd"]))
        r["flops_useful"] = float(spec.flops(r["real_tokens"], r["seqlen_sq_sum_thd"]))
    return records


@pytest.mark.parametrize("layout", ["thd", "bshd", "mixed"])
def test_padding_is_the_ledgers_padding_term(layout):
    records = triad_records(SPEC, docs_per_pack=5, doc_len=512)
    c = Coefficients.for_run(SPEC.to_dict(), {"peak_tflops": PEAK})
    sums = sums_of_rows(fields_of(r) for r in records)
    assert padding_share(sums, c, layout) == pytest.approx(ledger.padding_term(sums, c, layout).fraction)


def test_the_values_equal_the_records_own_flops():
    records = triad_records(SPEC, docs_per_pack=5, doc_len=512)
    c = Coefficients.for_run(SPEC.to_dict(), {"peak_tflops": PEAK})
    got = log_values(records, c, "thd")
    want = by_hand(records, dense=False)
    assert got["packscope/tflops_useful"] == pytest.approx(want["tflops"])
    assert got["packscope/mfu_useful"] == pytest.approx(want["tflops"] / PEAK)
    assert got["packscope/largest_loss_padding_pct"] == pytest.approx(want["padding_pct"])
    # No peak (a CPU): no MFU logged, never a 0; full packs: no padding loss to log.
    cpu = Coefficients.for_run(SPEC.to_dict(), {"peak_tflops": None})
    assert "packscope/mfu_useful" not in log_values(records, cpu, "thd")
    full = triad_records(SPEC, docs_per_pack=8, doc_len=512)
    assert set(log_values(full, c, "thd")) == {"packscope/tflops_useful", "packscope/mfu_useful"}
    assert log_values([], c, "thd") == {} and log_values([{**records[0], "refused": "bad"}], c, "thd") == {}


def possible(records: list[dict], dense: bool) -> list[dict[str, float]]:
    """The values over each run of consecutive records: a log covers those emitted since the last."""
    return [by_hand(records[i:j], dense) for i in range(len(records)) for j in range(i + 1, len(records) + 1)]


def matches(logged: dict[str, float], records: list[dict], dense: bool) -> bool:
    return any(
        logged["packscope/tflops_useful"] == pytest.approx(v["tflops"])
        and logged["packscope/mfu_useful"] == pytest.approx(v["tflops"] / PEAK)
        and logged.get("packscope/largest_loss_padding_pct", 0.0) == pytest.approx(v["padding_pct"], abs=1e-9)
        for v in possible(records, dense)
    )


# -- Hugging Face Trainer -------------------------------------------------------------------
def test_the_hf_trainer_logs_carry_the_values_before_the_reporting_callbacks(tmp_path, monkeypatch):
    transformers = pytest.importorskip("transformers")
    from packscope.agent.integrations.hf import PackscopeCallback

    monkeypatch.chdir(tmp_path)

    class Spy(transformers.TrainerCallback):
        """Stands for W&B or TensorBoard: what its on_log is given."""

        def __init__(self):
            self.logs: list[dict] = []

        def on_log(self, args, state, control, logs=None, **kwargs):
            self.logs.append(dict(logs or {}))

    def train(log_to_trainer: bool):
        torch.manual_seed(0)
        config = transformers.LlamaConfig(
            vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        )  # fmt: skip
        model = transformers.LlamaForCausalLM(config)
        g = torch.Generator().manual_seed(1)
        rows = [
            {"input_ids": torch.randint(3, 64, (int(n),), generator=g).tolist()} for n in torch.randint(4, 30, (64,))
        ]
        collator = transformers.DataCollatorWithPadding(
            transformers.PreTrainedTokenizerFast(tokenizer_object=_word_level(), pad_token="<pad>", eos_token="t2")
        )
        args = transformers.TrainingArguments(
            output_dir="hf-logs", per_device_train_batch_size=4, max_steps=8, logging_steps=2, report_to=[],
            use_cpu=True, save_strategy="no", disable_tqdm=True,
        )  # fmt: skip
        spy = Spy()
        callback = PackscopeCallback(run_name="hf-logs", log_to_trainer=log_to_trainer, peak_tflops=PEAK)
        trainer = transformers.Trainer(model=model, args=args, train_dataset=rows, data_collator=_labelled(collator),
                                       callbacks=[spy, callback])  # fmt: skip
        trainer.train()
        return spy, callback

    spy, callback = train(True)
    carried = [log for log in spy.logs if "packscope/tflops_useful" in log]
    records = list(callback.agent.records)
    assert carried and len(records) == 4
    assert all(matches(log, records, dense=True) for log in carried)
    assert any("packscope/largest_loss_padding_pct" in log for log in carried)  # padded rows
    spy, _ = train(False)
    assert spy.logs and not any(key.startswith("packscope/") for log in spy.logs for key in log)


def _word_level():
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel

    return Tokenizer(WordLevel({"<pad>": 0, **{f"t{i}": i for i in range(1, 64)}}, unk_token="t1"))


def _labelled(collator):
    def collate(features):
        batch = collator(features)
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        return batch

    return collate


# -- Lightning ------------------------------------------------------------------------------
def test_the_lightning_loggers_get_the_values_once_per_interval_unless_turned_off():
    L = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.loggers import Logger

    from packscope.agent.integrations.lightning import PackscopeCallback

    class Captured(Logger):
        def __init__(self):
            super().__init__()
            self.metrics: list[tuple[int, dict]] = []

        name = "captured"
        version = 0

        def log_metrics(self, metrics, step=None):
            self.metrics.append((step, dict(metrics)))

        def log_hyperparams(self, params, *args, **kwargs):
            pass

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Embedding(SPEC.vocab, 16), torch.nn.Linear(16, SPEC.vocab))

        def training_step(self, batch, batch_idx):
            tokens = batch["input_ids"]
            return torch.nn.functional.cross_entropy(self.net(tokens).reshape(-1, SPEC.vocab), tokens.reshape(-1))

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def collate(rows):
        ids = torch.randint(1, SPEC.vocab, (len(rows), 32))
        mask = torch.zeros(len(rows), 32, dtype=torch.long)
        for i, n in enumerate(rows):
            mask[i, :n] = 1
        return {"input_ids": ids, "attention_mask": mask}

    def fit(log_to_trainer: bool):
        logger = Captured()
        callback = PackscopeCallback(
            run_name="lightning-logs", model=SPEC, log_every=2, log_to_trainer=log_to_trainer, peak_tflops=PEAK
        )
        g = torch.Generator().manual_seed(2)
        loader = torch.utils.data.DataLoader(torch.randint(8, 33, (40,), generator=g).tolist(), batch_size=2,
                                             collate_fn=collate)  # fmt: skip
        trainer = L.Trainer(max_steps=8, accelerator="cpu", devices=1, logger=logger, log_every_n_steps=2,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            callbacks=[callback])  # fmt: skip
        trainer.fit(Tiny(), loader)
        ours = [(step, m) for step, m in logger.metrics if any(k.startswith("packscope/") for k in m)]
        return ours, callback

    ours, callback = fit(True)
    records = list(callback.agent.records)
    assert len(records) == 4 and 1 <= len(ours) <= len(records)  # at most once per interval record
    assert all(matches(m, records, dense=True) for _, m in ours)
    ours, _ = fit(False)
    assert ours == []
