"""Continuing a run with `packscope train --run-id ID --start-step N` against the real backend: after
a run that finished, and (slow) after one killed in its own process by SIGKILL, so that it flushes
nothing. The server then holds every step exactly once, in intervals that continue the first
part's numbering, with the documents an unbroken run has."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from typing import TYPE_CHECKING

import httpx
import pytest

from packscope.commands.cli import main
from packscope.trainer.config import add_train_arguments, config_from_args
from packscope.trainer.data import DocumentStream, step_documents

if TYPE_CHECKING:
    from .conftest import Backend

RUN_ID = "e2e-resume"
LOG_EVERY = 2
TRAIN_ARGS = (
    f"--preset tiny --layout thd --pack-length 128 --packs-per-step 2 --log-every {LOG_EVERY} "
    f"--device cpu --no-progress --run-id {RUN_ID}"
).split()


def stored_last_step(backend: Backend) -> int:
    response = httpx.get(f"{backend.url}/api/v1/runs/{RUN_ID}", timeout=5)
    if response.status_code == 404:  # not registered yet
        return 0
    return response.json()["last_step"] or 0


def train_until_killed(backend: Backend, min_step: int) -> int:
    """Start a long run in its own process, SIGKILL it once the server has stored min_step; return
    the last step the server holds from it."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one intra-op thread: steady on a busy machine
    cmd = [sys.executable, "-m", "packscope", "train", *TRAIN_ARGS, "--steps", "1000", "--server", backend.url]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 90
        while stored_last_step(backend) < min_step:
            assert proc.poll() is None, f"the first run exited early: {proc.stderr.read()}"
            assert time.monotonic() < deadline, "the first run stored too little in time"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait(30)
    # A request the killed process had in flight may still land after this read: the resumed run
    # then repeats that interval, and the server keeps the first copy of identical counts.
    return stored_last_step(backend)


def steps_documents(steps: int) -> list[list[int]]:
    """Each step's document lengths, rebuilt from the seeded data pipeline alone."""
    parser = argparse.ArgumentParser()
    add_train_arguments(parser)
    cfg = config_from_args(parser.parse_args(TRAIN_ARGS))
    docs = DocumentStream(cfg.data, cfg.model.vocab, cfg.pack_length, cfg.seed)
    groups = step_documents(
        iter(docs), cfg.micro_batches, cfg.packs_per_micro_batch, cfg.pack_length, cfg.max_docs_per_pack, cfg.align
    )
    return [[len(doc) for group in next(groups) for doc in group] for _ in range(steps)]


def resume(backend: Backend, start_step: int, steps: int, capsys: pytest.CaptureFixture[str]) -> None:
    """`packscope train --run-id RUN_ID --start-step ...` in this process, to the run's last step."""
    assert (
        main(["train", *TRAIN_ARGS, "--steps", str(steps), "--start-step", str(start_step), "--server", backend.url])
        == 0
    )
    summary = json.loads(capsys.readouterr().out)
    assert (summary["run_id"], summary["start_step"], summary["steps"]) == (RUN_ID, start_step, steps - start_step)


def check_continued(backend: Backend, last: int) -> None:
    """The server holds steps 1..last exactly once, in consecutive intervals of the seeded data."""
    run = backend.get(f"/api/v1/runs/{RUN_ID}")
    assert run["status"] == "finished" and run["last_step"] == last
    assert run["records"] == last // LOG_EVERY
    rows = sorted(backend.csv_rows(RUN_ID), key=lambda r: int(r["interval"]))
    assert [int(r["interval"]) for r in rows] == list(range(last // LOG_EVERY))  # no index twice
    spans = [(int(r["first_step"]), int(r["last_step"])) for r in rows]
    assert spans == [(s, s + LOG_EVERY - 1) for s in range(1, last, LOG_EVERY)]  # every step once
    # The resumed part trained on the documents that follow the first part's, not on its first.
    per_step = steps_documents(last)
    for row, (first, end) in zip(rows, spans, strict=True):
        docs = [n for step in per_step[first - 1 : end] for n in step]
        assert (int(row["documents"]), int(row["real_tokens"])) == (len(docs), sum(docs)), row


def test_a_finished_run_continues_under_its_run_id(backend: Backend, capsys: pytest.CaptureFixture[str]):
    assert main(["train", *TRAIN_ARGS, "--steps", str(2 * LOG_EVERY), "--server", backend.url]) == 0
    capsys.readouterr()
    resume(backend, start_step=2 * LOG_EVERY, steps=4 * LOG_EVERY, capsys=capsys)
    check_continued(backend, last=4 * LOG_EVERY)


@pytest.mark.slow  # a second interpreter importing torch: 35-60 s on this busy 2-core machine
def test_a_killed_run_continues_under_its_run_id(backend: Backend, capsys: pytest.CaptureFixture[str]):
    killed_at = train_until_killed(backend, min_step=2 * LOG_EVERY)
    assert killed_at % LOG_EVERY == 0 and killed_at >= 2 * LOG_EVERY
    assert backend.get(f"/api/v1/runs/{RUN_ID}")["status"] == "running"  # killed: nobody said otherwise
    resume(backend, start_step=killed_at, steps=killed_at + 2 * LOG_EVERY, capsys=capsys)
    check_continued(backend, last=killed_at + 2 * LOG_EVERY)
