"""PackscopeCallback in PyTorch Lightning, on CPU with a tiny LightningModule: every interval's
counts equal a brute-force computation over the packs the collate function was asked to build,
grouped into optimizer steps (gradient accumulation included)."""

from __future__ import annotations

import json
import random
import sqlite3
import statistics

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

L = pytest.importorskip("lightning.pytorch", reason="the Lightning integration's tests need packscope[lightning]")

from packscope.agent.histograms import NUM_BUCKETS, bucket_of  # noqa: E402
from packscope.agent.integrations.lightning import PackscopeCallback  # noqa: E402
from packscope.core.flops import ModelSpec  # noqa: E402

SPEC = ModelSpec(layers=2, hidden=16, heads=2, ffn=32, vocab=64)
PACK_LEN = 32


@pytest.fixture(autouse=True)
def _one_intra_op_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def random_packs(n: int, seed: int = 0) -> list[list[int]]:
    """Packs as lists of document lengths that fit PACK_LEN (some packs partly empty)."""
    rng = random.Random(seed)
    packs = []
    for _ in range(n):
        docs, room = [], rng.randint(PACK_LEN // 2, PACK_LEN)
        while room > 0:
            docs.append(rng.randint(1, room))
            room -= docs[-1]
        packs.append(docs)
    return packs


class Collate:
    """Builds one form of micro-batch from packs and records the packs it built (the truth)."""

    def __init__(self, form: str):
        self.form = form
        self.batches: list[tuple[list[list[int]], int]] = []  # (rows of document lengths, row length)

    def __call__(self, packs: list[list[int]]):
        rows = len(packs)
        input_ids = torch.randint(1, SPEC.vocab, (rows, PACK_LEN))
        cu, pos, mask = (
            [0],
            torch.zeros(rows, PACK_LEN, dtype=torch.long),
            torch.zeros(rows, PACK_LEN, dtype=torch.bool),
        )
        for r, docs in enumerate(packs):
            start = r * PACK_LEN
            for d in docs:
                cu.append(cu[-1] + d)
                pos[r, cu[-2] - start : cu[-1] - start] = torch.arange(d)
            mask[r, : sum(docs)] = True
            if cu[-1] < start + PACK_LEN:
                cu.append(start + PACK_LEN)  # the row's padding: a sequence of its own, masked out
        cu_seqlens = torch.tensor(cu, dtype=torch.int32)
        if self.form == "attention_mask":
            self.batches.append(([[sum(docs)] for docs in packs], PACK_LEN))  # BSHD: one document per row
            return {"input_ids": input_ids, "attention_mask": mask}
        self.batches.append((packs, PACK_LEN))
        if self.form == "cu_seqlens":
            return {"input_ids": input_ids, "cu_seqlens": cu_seqlens, "token_mask": mask.reshape(-1)}
        if self.form == "position_ids":
            return {"input_ids": input_ids, "position_ids": pos, "attention_mask": mask}
        return input_ids, cu_seqlens, mask  # "tuple": read by the user's batch_to_form


class Tiny(L.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(torch.nn.Embedding(SPEC.vocab, 16), torch.nn.Linear(16, SPEC.vocab))
        self.losses: list[float] = []

    def training_step(self, batch, batch_idx):
        tokens = batch["input_ids"] if isinstance(batch, dict) else batch[0]
        logits = self.net(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, SPEC.vocab), tokens.reshape(-1))
        self.losses.append(loss.item())  # the test's own record, not the agent's
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


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


def counted(r: dict) -> dict:
    keys = ("tokens", "packs", "real_tokens", "documents", "seqlen_sq_sum_bshd", "seqlen_sq_sum_thd")
    return {**{k: r[k] for k in keys}, "doc_hist": r["histograms"]["documents"]["count"]}


def fit(form: str, callback: PackscopeCallback, steps: int = 5, accumulation: int = 2, **trainer_args):
    collate = Collate(form)
    loader = torch.utils.data.DataLoader(
        random_packs(max(60, 3 * steps * accumulation)), batch_size=3, collate_fn=collate
    )
    module = Tiny()
    trainer = L.Trainer(
        **trainer_args,
        max_steps=steps,
        accumulate_grad_batches=accumulation,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[callback],
    )
    trainer.fit(module, loader)
    return collate, module


def tuple_form(batch):
    input_ids, cu_seqlens, mask = batch
    return {"cu_seqlens": cu_seqlens, "shape": tuple(input_ids.shape), "token_mask": mask}


@pytest.mark.parametrize(
    "form, steps, log_every",
    [
        ("cu_seqlens", 5, 2),
        ("position_ids", 5, 2),
        ("attention_mask", 5, 2),
        ("tuple", 5, 2),
        # 24 micro-batches an interval: observed once 16 are kept (PENDING_FORWARDS), then at the boundary
        ("position_ids", 14, 12),
    ],
)
def test_every_interval_equals_brute_force(form, steps, log_every):
    accumulation = 2
    cb = PackscopeCallback(
        run_name="lightning", model=SPEC, log_every=log_every, batch_to_form=tuple_form if form == "tuple" else None
    )
    collate, module = fit(form, cb, steps, accumulation)
    records = list(cb.agent.records)
    assert [(r["first_step"], r["last_step"]) for r in records] == [
        (s + 1, min(s + log_every, steps)) for s in range(0, steps, log_every)
    ]
    # The loader may collate ahead of training; the first batches are the trained ones.
    trained = collate.batches[: steps * accumulation]
    assert len(module.losses) == len(trained)
    for i, r in enumerate(records):
        batches = trained[i * log_every * accumulation : (i + 1) * log_every * accumulation]
        assert counted(r) == brute(batches)
        assert r["flops_thd"] == SPEC.flops(r["tokens"], r["seqlen_sq_sum_thd"])
        losses = module.losses[i * log_every * accumulation : (i + 1) * log_every * accumulation]
        assert r["loss"] == pytest.approx(sum(losses) / len(losses), rel=1e-5)
        assert r["lr"] == 0.1


def test_the_model_comes_from_a_hugging_face_config_on_the_module():
    config = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 16,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "vocab_size": 64,
    }
    cb = PackscopeCallback(run_name="lightning-hf", log_every=2)

    class WithConfig(Tiny):
        def __init__(self):
            super().__init__()
            self.config = config

    loader = torch.utils.data.DataLoader(random_packs(8), batch_size=2, collate_fn=Collate("cu_seqlens"))
    L.Trainer(
        max_steps=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[cb],
    ).fit(WithConfig(), loader)
    assert cb.agent.model.hidden == 16 and cb.agent.model.name == "llama"


def test_a_batch_it_cannot_read_says_what_to_do():
    cb = PackscopeCallback(run_name="lightning-tuple", model=SPEC)
    with pytest.raises(TypeError, match="batch_to_form"):
        fit("tuple", cb, steps=1, accumulation=1)


def test_intervals_follow_the_trainers_log_every_n_steps():
    cb = PackscopeCallback(run_name="lightning-log-every", model=SPEC)  # no log_every: the Trainer's
    collate, module = fit("cu_seqlens", cb, steps=12, accumulation=1, log_every_n_steps=5)
    assert [(r["first_step"], r["last_step"]) for r in cb.agent.records] == [(1, 5), (6, 10), (11, 12)]
    for i, r in enumerate(cb.agent.records):
        assert counted(r) == brute(collate.batches[i * 5 : min(i * 5 + 5, 12)])
        assert r["loss"] == pytest.approx(statistics.fmean(module.losses[i * 5 : min(i * 5 + 5, 12)]), rel=1e-5)


class CountOps(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += not func.is_view
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("form", ["cu_seqlens", "position_ids", "attention_mask"])
def test_an_ordinary_step_runs_no_op_in_the_callback(form):
    cb = PackscopeCallback(run_name="lightning-no-ops", model=SPEC, log_every=3)
    ops: dict[int, int] = {}

    def counted(fn):
        def call(*args, **kwargs):
            with CountOps() as counter:
                out = fn(*args, **kwargs)
            step = cb.agent.step if cb.agent is not None else 0
            ops[step] = ops.get(step, 0) + counter.count
            return out

        return call

    for name in ("on_train_batch_start", "on_before_optimizer_step", "on_train_batch_end"):
        setattr(cb, name, counted(getattr(cb, name)))
    collate, _ = fit(form, cb, steps=5, accumulation=2)
    assert {step for step, n in ops.items() if n} == {3}, ops  # the boundary's one chain, nothing else
    assert sum(r["documents"] for r in cb.agent.records) == brute(collate.batches[:10])["documents"]


def test_without_a_server_the_run_is_kept_for_packscope_sync(tmp_path):
    cb = PackscopeCallback(server=None, spool_dir=str(tmp_path / "runs"), run_name="lightning-offline", model=SPEC)
    fit("cu_seqlens", cb, steps=4, accumulation=1, log_every_n_steps=2)
    db = sqlite3.connect(tmp_path / "runs" / f"{cb.agent.run_id}.sqlite")
    try:
        spooled = [json.loads(body) for (body,) in db.execute("SELECT body FROM records ORDER BY id")]
    finally:
        db.close()
    assert spooled == list(cb.agent.records) and len(spooled) == 2
