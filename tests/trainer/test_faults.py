"""`packscope train --fault`: each fault parses from its one text (and a wrong one is refused in
one line), costs nothing when absent, and shows in the records the agent writes (run file mode, no
server): step times grow, a gap between intervals, a non-finite loss, syncs at the fault's own
code line, another document-length mix, and one rank slower than the other."""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
import torch.distributed as dist

from packscope.agent.syncs import SYNC_WARNING
from packscope.commands.cli import main
from packscope.core.run_file import read_run_file
from packscope.trainer.config import DataConfig, TrainConfig, add_train_arguments, config_from_args
from packscope.trainer.faults import (
    AddedSyncs,
    Crash,
    FaultInjector,
    InjectedCrash,
    MixChange,
    NanLoss,
    Slowdown,
    SlowRank,
    Stall,
    fault_text,
    parse_fault,
)
from packscope.trainer.train import Trainer, run_training, train_step

SHORT_DOCS = DataConfig(min_len=8, short_median=24, long_median=96)
LOG_EVERY = 5


@pytest.fixture(autouse=True)
def _one_intra_op_thread() -> Iterator[None]:
    """One intra-op thread, as tests/trainer/test_trainer_train.py says why (steadier CPU steps)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def run_with(tmp_path: Path, *faults: str, steps: int = 30, **overrides: Any) -> list[dict[str, Any]]:
    """Train on the CPU with these faults and return rank 0's records, as `packscope import` reads them."""
    base = dict(
        steps=steps,
        pack_length=128,
        packs_per_step=2,
        device="cpu",
        progress=False,
        log_every=LOG_EVERY,
        records_dir=str(tmp_path),
        data=SHORT_DOCS,
        faults=faults,
    )
    run_training(TrainConfig(**{**base, **overrides}))
    return read_run_file(tmp_path / "rank0.jsonl").records


def holding(records: list[dict[str, Any]], step: int) -> dict[str, Any]:
    return next(r for r in records if r["first_step"] <= step <= r["last_step"])


# -- the texts ---------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("slowdown:from=40,factor=1.5", Slowdown(start=40, factor=1.5)),
        ("slowdown:from=40,factor=2,until=60", Slowdown(start=40, factor=2.0, until=60)),
        ("stall:at=30,seconds=12.5", Stall(at=30, seconds=12.5)),
        ("slow-rank:rank=1,factor=1.4", SlowRank(rank=1, factor=1.4)),
        ("slow-rank:rank=0,factor=3,from=5,until=9", SlowRank(rank=0, factor=3.0, start=5, until=9)),
        ("slow-rank:rank=1,factor=2,apart=off", SlowRank(rank=1, factor=2.0, apart=False)),
        ("syncs:from=20,count=4", AddedSyncs(start=20, count=4)),
        ("nan-loss:at=17", NanLoss(at=17)),
        ("nan-loss:at=17,steps=3", NanLoss(at=17, steps=3)),
        ("mix:from=25", MixChange(start=25)),
        ("mix:from=25,short_share=0.1,until=50", MixChange(start=25, short_share=0.1, until=50)),
        ("crash:at=7", Crash(at=7)),
    ],
)
def test_each_fault_parses_from_its_text_and_back(text, fault):
    assert parse_fault(text) == fault
    assert parse_fault(fault_text(fault)) == fault


@pytest.mark.parametrize(("apart", "barriers"), [(True, 1), (False, 0)])
def test_a_slow_rank_apart_waits_between_steps_and_one_not_apart_does_not(monkeypatch, apart, barriers):
    # apart=off is the real job's case: no barrier, so the others wait inside their own steps.
    import torch.distributed as dist

    calls = []
    monkeypatch.setattr(dist, "barrier", lambda *a, **k: calls.append(1))
    FaultInjector((SlowRank(rank=1, factor=2.0, apart=apart),), rank=0, world_size=2).before_step(3)
    assert len(calls) == barriers


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("slowness:from=3", "unknown fault 'slowness' in 'slowness:from=3'; choose one of slowdown, stall,"),
        ("slowdown:factor=2", "slowdown needs from=: slowdown:from=N,factor=F[,until=M]"),
        ("slowdown:from=3,factor=0.5", "slowdown: factor must be a finite number > 1, got 0.5"),
        ("slowdown:from=3,factor=2,every=4", "slowdown: 'every=4' is not one of from=, factor=, until="),
        ("slowdown:from=ten,factor=2", "slowdown: from must be an integer, got 'ten'"),
        ("slowdown:from=0,factor=2", "slowdown: from must be >= 1 (steps count from 1), got 0"),
        ("slowdown:from=9,factor=2,until=9", "slowdown: until (9) must be after from (9)"),
        ("stall:at=3,seconds=0", "stall: seconds must be > 0, got 0.0"),
        ("stall:at=3", "stall needs seconds=: stall:at=N,seconds=S"),
        ("slow-rank:rank=-1,factor=2", "slow-rank: rank must be >= 0, got -1"),
        ("slow-rank:rank=1,factor=2,apart=maybe", "slow-rank: apart must be on or off, got 'maybe'"),
        ("syncs:from=3,count=0", "syncs: count must be >= 1 (steps count from 1), got 0"),
        ("mix:from=3,short_share=2", "mix: short_share must be between 0 and 1, got 2.0"),
        ("nan-loss", "nan-loss needs at=: nan-loss:at=N[,steps=K]"),
    ],
)
def test_a_wrong_fault_is_refused_in_one_line(text, message, capsys):
    with pytest.raises(ValueError) as raised:
        parse_fault(text)
    assert message in str(raised.value) and "\n" not in str(raised.value)
    with pytest.raises(SystemExit) as exit:
        main(["train", "--fault", text])
    assert exit.value.code == 2
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith("packscope train: error: argument --fault: ") and message in last


def test_the_option_repeats_and_the_config_holds_every_fault():
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    args = parser.parse_args(["--fault", "stall:at=3,seconds=1", "--fault", "nan-loss:at=5"])
    assert config_from_args(args).faults == (Stall(at=3, seconds=1.0), NanLoss(at=5))
    assert config_from_args(parser.parse_args([])).faults == ()


def test_without_a_fault_the_loop_holds_no_injector():
    trainer = Trainer(TrainConfig(steps=2, pack_length=128, packs_per_step=2, device="cpu", data=SHORT_DOCS))
    assert trainer.faults is None
    train_step(trainer, trainer.next_batches())
    assert trainer.step == 1


# -- each fault in the records ---------------------------------------------------------------------
def step_time(record: dict[str, Any]) -> float:
    return record["step_time_p50_s"]


def test_a_slowdown_multiplies_the_step_time_while_it_lasts(tmp_path):
    records = run_with(tmp_path, "slowdown:from=11,factor=4,until=21")
    # Interval 0 (steps 1-5) is warm-up; the fault holds steps 11-20, intervals 2 and 3.
    before_after = [step_time(r) for r in records if r["interval"] in (1, 4, 5)]
    slowed = [step_time(r) for r in records if r["interval"] in (2, 3)]
    # At least: a sleep oversleeps, and a busy machine's noise lands on either side.
    assert statistics.median(slowed) > 2.5 * statistics.median(before_after), (slowed, before_after)


def test_a_stall_leaves_a_gap_between_the_intervals(tmp_path):
    records = run_with(tmp_path, "stall:at=11,seconds=1.5", steps=20)
    gaps = {b["interval"]: b["wall_start"] - a["wall_end"] for a, b in itertools.pairwise(records)}
    assert gaps[2] >= 1.5, gaps  # the interval of steps 11-15 starts after the stall
    assert all(gap < 1.0 for interval, gap in gaps.items() if interval != 2), gaps
    assert step_time(holding(records, 11)) < 1.0  # the stall is between steps, not inside one


def test_a_nan_loss_is_non_finite_in_its_interval_only(tmp_path):
    records = run_with(tmp_path, "nan-loss:at=12", steps=20, peak_tflops=0.01)
    # --peak-tflops: the run's hardware has a peak on the CPU too, so its MFU is measured.
    assert read_run_file(tmp_path / "rank0.jsonl").run["hardware"]["peak_tflops"] == 0.01
    losses = {r["interval"]: r["loss"] for r in records}
    assert losses[2] != losses[2]  # NaN: the interval of steps 11-15
    assert all(loss == loss for interval, loss in losses.items() if interval != 2), losses


def test_a_crash_ends_the_run_at_its_step(tmp_path):
    with pytest.raises(InjectedCrash, match="--fault crash:at=4"):
        run_with(tmp_path, "crash:at=4", steps=10)
    assert not (tmp_path / "rank0.jsonl").exists()  # a failed run writes no run file


# What PyTorch does on CUDA in sync debug mode, on the CPU: a blocking read warns from inside torch
# (a file under torch's folder, so the site is its caller's line). The agent's counter is installed
# as on a GPU machine; the CPU has no device to wait for, so it counts nothing otherwise.
TORCH_FILE = os.path.join(os.path.dirname(torch.__file__), "_fault_test_item.py")
# Only a read made outside torch warns: torch's own CPU code (the unfused AdamW's step counts) reads
# values that the CUDA path (fused AdamW) keeps on the device.
ITEM_SOURCE = (
    "def item(self):\n"
    "    if not sys._getframe(1).f_code.co_filename.startswith(TORCH_DIR):\n"
    "        warnings.warn(MESSAGE, UserWarning)\n"
    "    return ORIGINAL(self)\n"
)


def test_added_syncs_are_counted_at_the_faults_own_code_line(tmp_path):
    namespace: dict = {
        "warnings": warnings,
        "sys": sys,
        "TORCH_DIR": os.path.dirname(torch.__file__),
        "MESSAGE": SYNC_WARNING,
        "ORIGINAL": torch.Tensor.item,
    }
    exec(compile(ITEM_SOURCE, TORCH_FILE, "exec"), namespace)
    with (
        mock.patch("torch.cuda.is_available", return_value=True),
        mock.patch("torch.cuda.get_sync_debug_mode", return_value=0),
        mock.patch("torch.cuda.set_sync_debug_mode"),
        mock.patch.object(torch.Tensor, "item", namespace["item"]),
        warnings.catch_warnings(),
    ):
        records = run_with(tmp_path, "syncs:from=11,count=3", steps=20, count_syncs_every=1)
    sites = {r["interval"]: {s["site"]: s["count"] for s in r["syncs"]["sites"]} for r in records}
    fault_site = [site for site in sites[3] if site.endswith("in added_syncs")]
    assert len(fault_site) == 1 and "faults.py:" in fault_site[0], sites[3]
    for interval in (2, 3):  # steps 11-20: 3 syncs a step, 5 steps an interval
        assert sites[interval][fault_site[0]] == 3 * LOG_EVERY
        assert holding(records, 5 * interval + 1)["syncs"]["total"] >= 3 * LOG_EVERY
    for interval in (0, 1):
        assert fault_site[0] not in sites[interval]
    per_step = {r["interval"]: r["syncs"]["total"] / r["steps"] for r in records}
    assert per_step[3] - per_step[1] == 3


def test_a_mix_change_draws_documents_of_another_length_mix(tmp_path):
    # Short share 0.7 -> 0.1 from step 11: the documents get longer on average.
    records = run_with(tmp_path, "mix:from=11,short_share=0.1", steps=40)
    mean_length = {r["interval"]: r["real_tokens"] / r["documents"] for r in records}
    before = [mean_length[i] for i in (0, 1)]
    after = [mean_length[i] for i in range(2, 8)]
    assert min(after) > max(before), mean_length
    # The same stream as a run without the fault until the switch.
    plain = run_with(tmp_path / "plain", steps=10)
    assert [r["documents"] for r in plain] == [r["documents"] for r in records[:2]]


# -- one slow rank, 2 gloo ranks under torchrun ------------------------------------------------------
@pytest.mark.slow  # two processes that each import torch: about 20 s on a 2-core machine
@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo")
def test_a_slow_rank_is_slower_than_the_other(tmp_path):
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
        "-m", "packscope", "train", "--parallel", "ddp", "--device", "cpu", "--steps", "20",
        "--log-every", str(LOG_EVERY), "--pack-length", "128", "--packs-per-step", "2", "--no-progress",
        "--data-short-median", "24", "--data-long-median", "96", "--records-dir", str(tmp_path),
        "--fault", "slow-rank:rank=1,factor=3,from=6",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [read_run_file(tmp_path / f"rank{r}.jsonl").records for r in (0, 1)]
    for interval in (1, 2, 3):  # steps 6-20
        fast, slow = (step_time(records[interval]) for records in ranks)
        assert slow > 1.8 * fast, (interval, fast, slow)
    fast, slow = (step_time(records[0]) for records in ranks)  # steps 1-5, before the fault
    assert slow < 1.8 * fast
