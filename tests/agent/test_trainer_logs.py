"""What the HF Trainer and Lightning callbacks add to the trainer's own logs
(agent/integrations/trainer_logs.py): useful TFLOP/s, useful MFU and the largest loss, each equal
to a computation from the agent's own records' FLOPs fields (the model's triad, not the
catalogue's path), present before the reporting callbacks see the logs, absent when turned off;
on CPU with tiny models. That no ordinary step runs an op is tests/agent/test_integrations_*'s."""

from __future__ import annotations

import pytest
import torch
from wire_records import packed_interval

from packscope.agent.integrations.trainer_logs import fields_of, log_values
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


def by_hand(records: list[dict], dense: bool) -> dict[str, float | None]:
    """From the records' own FLOPs fields (the agent's triad at the boundary), GPU time and data
    wait (one rank: the step time is its GPU time over its steps)."""
    useful = sum(r["flops_useful"] for r in records)
    computed = sum(r["flops_bshd" if dense else "flops_thd"] for r in records)
    seconds = sum(r["gpu_time_s"] * r["gpus"] for r in records)
    step = sum(r["gpu_time_s"] for r in records) / sum(r["steps"] for r in records)
    timed = [r for r in records if r.get("data_wait_gaps")]
    wait = sum(r["data_wait_s"] for r in timed) / sum(r["data_wait_gaps"] for r in timed) if timed else None
    return {
        "tflops": useful / seconds / 1e12,
        "padding_pct": 100 * (computed - useful) / computed,
        "data_wait_pct": None if wait is None else 100 * wait / step,
    }


def largest_by_hand(v: dict[str, float | None]) -> dict[str, float]:
    """The largest loss key a CPU run's log carries: padding or the time between steps (its
    other terms need the CUPTI trace), whichever is larger, if above 0."""
    priced = {name: v[f"{name}_pct"] for name in ("padding", "data_wait") if (v[f"{name}_pct"] or 0) > 0}
    if not priced:
        return {}
    name = max(priced, key=lambda n: priced[n])
    return {f"packscope/largest_loss_{name}_pct": priced[name]}


def triad_records(spec: ModelSpec, **kwargs) -> list[dict]:
    records = [packed_interval(k, **kwargs) for k in range(3)]
    for r in records:  # the FLOPs fields as the agent computes them (packed_interval's are placeholders)
        r["flops_bshd"] = float(spec.flops(r["tokens"], r["seqlen_sq_sum_bshd"]))
        r["flops_thd"] = float(spec.flops(r["tokens"], r["seqlen_sq_sum_thd"]))
        r["flops_useful"] = float(spec.flops(r["real_tokens"], r["seqlen_sq_sum_thd"]))
    return records


@pytest.mark.parametrize("layout", ["thd", "bshd", "mixed"])
def test_the_logged_padding_is_the_ledgers_padding_term(layout):
    records = triad_records(SPEC, docs_per_pack=5, doc_len=512)
    c = Coefficients.for_run(SPEC.to_dict(), {"peak_tflops": PEAK})
    sums = sums_of_rows(fields_of(r) for r in records)
    got = log_values(records, c, layout)
    assert got["packscope/largest_loss_padding_pct"] == pytest.approx(
        100 * ledger.padding_term(sums, c, layout).fraction
    )


def test_the_largest_loss_is_whichever_term_of_the_ranks_own_records_is_largest():
    """By hand, on the records' own fields: a 50 ms step (0.5 s over 10 steps an interval)."""
    c = Coefficients.for_run(SPEC.to_dict(), {"peak_tflops": PEAK})
    # 40 ms between steps (0.36 s over 9 gaps an interval): 80% of the step, more than padding's share.
    waiting = triad_records(SPEC, docs_per_pack=5, doc_len=512)
    for r in waiting:
        r.update(data_wait_s=0.36, data_wait_gaps=9)
    got = log_values(waiting, c, "thd")
    assert got["packscope/largest_loss_data_wait_pct"] == pytest.approx(100 * 0.040 / 0.050)
    assert "packscope/largest_loss_padding_pct" not in got
    # Full packs, traced syncs: per step 20 ms idle after syncs (60 of 150 traced ms) and 5 ms
    # launch-bound, 1 ms between steps; the host blocked 30 ms a step in the syncs. Their time is
    # the idle it covers, at most the blocked time: min(20 + 1 + 5, 30) = 26 ms of the 50.
    syncing = triad_records(SPEC, docs_per_pack=8, doc_len=512)
    for r in syncing:
        r.update(data_wait_s=0.009, data_wait_gaps=9, traced_steps=3, traced_step_time_s=0.15, traced_busy_s=0.075)
        r.update(sync_idle_s=0.06, launch_idle_s=0.015, traced_gaps=2, sync_idle_between_s=0.0)
        r.update(sync_blocked_s=0.09, sync_blocked_between_s=0.0)
    got = log_values(syncing, c, "thd")
    assert {k for k in got if "largest_loss" in k} == {"packscope/largest_loss_host_syncs_pct"}
    assert got["packscope/largest_loss_host_syncs_pct"] == pytest.approx(100 * 0.026 / 0.050)


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
        and {k: x for k, x in logged.items() if "largest_loss" in k} == pytest.approx(largest_by_hand(v))
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
    assert any(key.startswith("packscope/largest_loss_") for log in carried for key in log)  # padded rows
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
