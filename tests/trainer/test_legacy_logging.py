"""--legacy-logging reads device values at its own code sites every step; the fixed path reads
none (on the CPU, where sync debug mode is unavailable, a spy on the reading methods stands in
for the sync counter; GPU counts come from the agent on the H200)."""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterator

import pytest
import torch

import packscope.agent
import packscope.trainer
from packscope.agent import Agent, AgentConfig
from packscope.core.run_file import read_run_file
from packscope.trainer import legacy_logging
from packscope.trainer.config import DataConfig, TrainConfig
from packscope.trainer.train import LossReadout, Trainer, run_training, train_step

OURS = (os.path.dirname(packscope.trainer.__file__), os.path.dirname(packscope.agent.__file__))
READS = ("item", "tolist", "__bool__", "__float__", "__int__", "__index__")


@pytest.fixture(autouse=True)
def _one_intra_op_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def spy_reads(monkeypatch) -> Counter:
    """Count reads of tensor values, and torch.tensor calls, made by packscope's own code, by site."""
    sites: Counter = Counter()

    def wrap(owner, name):
        original = getattr(owner, name)

        def spy(*args, **kwargs):
            caller = __import__("sys")._getframe(1)
            if caller.f_code.co_filename.startswith(OURS):
                sites[(name, os.path.basename(caller.f_code.co_filename), caller.f_lineno)] += 1
            return original(*args, **kwargs)

        monkeypatch.setattr(owner, name, spy)

    for name in READS:
        wrap(torch.Tensor, name)
    wrap(torch, "tensor")
    return sites


def run(monkeypatch, steps=3, **overrides) -> tuple[Counter, Trainer]:
    cfg = TrainConfig(
        preset="tiny",
        steps=10,
        pack_length=128,
        packs_per_step=2,
        micro_batches=2,
        device="cpu",
        progress=False,
        data=DataConfig(min_len=8, short_median=24, long_median=64),
        **overrides,
    )
    trainer = Trainer(cfg)
    agent = Agent(AgentConfig(log_every=100, count_syncs=False), model=trainer.model_cfg.to_model_spec())
    batches = [trainer.next_batches() for _ in range(steps)]  # the data is the host's own work
    train_step(trainer, batches[0], agent)  # first step: lazy state
    sites = spy_reads(monkeypatch)
    for b in batches[1:]:
        train_step(trainer, b, agent)
    monkeypatch.undo()
    agent.close()
    return sites, trainer


def test_legacy_logging_reads_at_its_own_sites_every_step(monkeypatch):
    sites, trainer = run(monkeypatch, legacy_logging=True)
    steps = 2
    by_kind = Counter()
    for (name, file, _line), n in sites.items():
        assert file == "legacy_logging.py", (name, file)
        by_kind[name] += n
    buckets = math.ceil(sum(1 for _ in trainer.model.parameters()) / legacy_logging.BUCKET_PARAMS)
    assert by_kind == {"item": 2 * steps, "tensor": steps, "__bool__": buckets * steps}
    assert len({line for (name, _, line) in sites if name == "item"}) == 2  # loss and grad norm apart
    assert math.isfinite(trainer.legacy_logging.loss) and trainer.legacy_logging.grad_norm > 0


@pytest.mark.parametrize(
    "overrides",
    [{}, {"channel_loss": True}, {"chunked_ce": True}, {"layout": "bshd"}],
    ids=["default", "channel-loss", "plain-ce", "bshd"],
)
def test_the_fixed_path_reads_nothing(monkeypatch, overrides):
    sites, _ = run(monkeypatch, **overrides)
    assert not sites


def test_legacy_channel_loss_reads_per_document(monkeypatch):
    sites, _ = run(monkeypatch, channel_loss=True, legacy_channel_loss=True)
    assert {file for (_, file, _) in sites} == {"channel_loss.py"}
    assert sum(n for (name, _, _), n in sites.items() if name == "item") > 0


def test_a_legacy_logging_run_passes_its_log_steps(tmp_path):
    """`packscope train --steps 6 --log-every 5 --legacy-logging`: its [1] loss accumulator goes
    through the progress readout and the agent at steps 5 and 6."""
    cfg = TrainConfig(
        preset="tiny",
        steps=6,
        log_every=5,
        pack_length=64,
        device="cpu",
        progress=False,
        data=DataConfig(min_len=8, short_median=24, long_median=48),
        legacy_logging=True,
        records_dir=str(tmp_path),
    )
    summary = run_training(cfg)
    assert summary["steps"] == 6 and math.isfinite(summary["final_loss"])
    records = read_run_file(tmp_path / "rank0.jsonl").records
    assert [r["steps"] for r in records] == [5, 1]
    assert all(math.isfinite(r["loss"]) for r in records)


@pytest.mark.parametrize("shape", [(), (1,)])
def test_the_loss_readout_takes_a_one_element_loss(shape):
    readout = LossReadout(torch.device("cpu"))
    readout.push(torch.full(shape, 2.5))
    assert readout.poll() == 2.5 and readout.poll() is None


def test_the_nan_check_stops_a_nan_gradient():
    trainer = Trainer(
        TrainConfig(
            preset="tiny",
            steps=2,
            pack_length=64,
            device="cpu",
            progress=False,
            data=DataConfig(min_len=8, short_median=24, long_median=48),
            legacy_logging=True,
        )
    )
    for p in trainer.model.parameters():
        p.grad = torch.zeros_like(p)
    next(iter(trainer.model.parameters())).grad[0] = float("nan")
    with pytest.raises(FloatingPointError, match="NaN gradient"):
        trainer.legacy_logging.check_gradients(trainer.model)
