"""A real `packscope train` process against the real backend, ended the ways runs end on clusters:
kill -9 (nothing runs: the server sees the heartbeats stop, shows the run stale, then crashed,
and a resume brings it back), kill -TERM (the agent marks the run failed before the process
ends), and two gloo ranks under torchrun posting to one run."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
import torch.distributed as dist

if TYPE_CHECKING:
    from .conftest import Backend

pytestmark = pytest.mark.slow  # training processes: each test takes 15-40 s here

BEAT_S = 0.5  # the heartbeat the trainer's agent promises here: stale after 1.5 s, crashed after 5 s
TRAIN = "--preset tiny --layout thd --pack-length 64 --packs-per-step 2 --log-every 4 --device cpu --no-progress"
ANNOUNCED = re.compile(r"packscope: run (\S+): (\S+)")


def environment() -> dict[str, str]:
    """This environment (its HOME the test's own: tests/conftest.py) without PACKSCOPE_* variables."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PACKSCOPE_")}
    return {**env, "OMP_NUM_THREADS": "1", "PACKSCOPE_HEARTBEAT_S": str(BEAT_S)}


def start_training(backend: Backend, tmp_path: Path, *extra: str, steps: int = 2000) -> tuple[subprocess.Popen, str]:
    """A long `packscope train` in its own process; (the process, the run id it announced)."""
    cmd = [sys.executable, "-m", "packscope", "train", *TRAIN.split(), "--steps", str(steps), "--server", backend.url]
    proc = subprocess.Popen(
        [*cmd, *extra], env=environment(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        found = ANNOUNCED.search(line)
        if found:
            run_id, url = found.groups()
            assert url == f"{backend.url}/runs/{run_id}"  # the dashboard page, printed as the run starts
            return proc, run_id
        assert line or proc.poll() is None, "the trainer ended before it announced its run"
    raise AssertionError("the trainer never printed its run's URL")


def run_of(backend: Backend, run_id: str) -> dict[str, Any]:
    response = httpx.get(f"{backend.url}/api/v1/runs/{run_id}", timeout=10)
    return response.json() if response.status_code == 200 else {"status": None, "records": 0, "last_step": None}


def wait_for(what: str, condition, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def listed(backend: Backend, status: str) -> list[str]:
    return [r["run_id"] for r in backend.get("/api/v1/runs", status=status)["runs"]]


def test_a_run_killed_with_sigkill_goes_stale_then_crashed_and_a_resume_revives_it(backend, tmp_path):
    proc, run_id = start_training(backend, tmp_path)
    try:
        wait_for("three intervals", lambda: (run_of(backend, run_id)["last_step"] or 0) >= 12, 120)
        assert run_of(backend, run_id)["status"] == "running" and listed(backend, "running") == [run_id]
    finally:
        proc.kill()  # SIGKILL: no handler, no flush, no last word
        proc.wait(30)
    killed_at = time.time()
    wait_for("stale", lambda: run_of(backend, run_id)["status"] == "stale", 30)
    run = run_of(backend, run_id)
    contact = datetime.fromisoformat(run["last_contact_at"]).timestamp()
    assert killed_at - 10 < contact <= killed_at + 1  # shown with the time it was last heard of
    assert listed(backend, "stale") == [run_id] and listed(backend, "running") == []
    wait_for("crashed", lambda: run_of(backend, run_id)["status"] == "crashed", 30)
    assert listed(backend, "crashed") == [run_id]
    assert run_of(backend, run_id)["ended_at"] is None  # not a status anyone set: what the silence says

    # The same run continued from its last stored step: running again, then finished.
    last = run_of(backend, run_id)["last_step"]
    proc, resumed = start_training(backend, tmp_path, "--run-id", run_id, "--start-step", str(last), steps=last + 8)
    try:
        assert resumed == run_id
        wait_for("running again", lambda: run_of(backend, run_id)["status"] in ("running", "finished"), 60)
        assert proc.wait(120) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    run = run_of(backend, run_id)
    assert run["status"] == "finished" and run["last_step"] == last + 8


def test_a_run_stopped_with_sigterm_is_failed_at_once(backend, tmp_path):
    proc, run_id = start_training(backend, tmp_path)
    try:
        wait_for("two intervals", lambda: (run_of(backend, run_id)["last_step"] or 0) >= 8, 120)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(30)
    finally:
        if proc.poll() is None:
            proc.kill()
    said = proc.stderr.read() if proc.stderr else ""  # where a failed status request is logged
    assert code == -signal.SIGTERM, said[-2000:]  # the default action still ends the process
    run = run_of(backend, run_id)
    assert run["status"] == "failed" and run["ended_at"] is not None, (run, said[-2000:])
    time.sleep(3 * BEAT_S + 0.5)
    assert run_of(backend, run_id)["status"] == "failed"  # a status it set, not silence
    assert listed(backend, "failed") == [run_id] and listed(backend, "stale") == []


@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo")
def test_two_gloo_ranks_post_one_run_to_a_live_server(backend, tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    cmd += ["-m", "packscope", "train", "--parallel", "ddp", *TRAIN.split(), "--steps", "16", "--server", backend.url]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=environment(), cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    announced = ANNOUNCED.findall(done.stderr)
    assert len(announced) == 1, done.stderr[-2000:]  # rank 0 prints the run's page, once
    run_id = announced[0][0]
    summaries = [json.loads(block) for block in re.findall(r"^\{.*?^\}", done.stdout, re.M | re.S)]
    assert {s["rank"] for s in summaries} == {0, 1} and {s["run_id"] for s in summaries} == {run_id}

    run = run_of(backend, run_id)
    assert run["status"] == "finished" and run["records"] == 2 * 4  # 4 intervals from each rank
    assert run["layout"] == "thd" and run["pack_length"] == 64 and run["pack_length_from"] == "--pack-length"
    assert run["heartbeat_s"] == BEAT_S  # rank 0's
    ranks = backend.get(f"/api/v1/runs/{run_id}/ranks")
    assert ranks["ranks"] == [0, 1] and ranks["reporting_ranks"] == [2, 2, 2, 2]
    rows = backend.csv_rows(run_id)
    assert sorted((int(r["rank"]), int(r["interval"])) for r in rows) == [(r, i) for r in (0, 1) for i in range(4)]
    # Each rank's work is its own: the run's tokens are both ranks' (the steps are the lead's issue).
    assert run["totals"]["real_tokens"] == sum(s["real_tokens"] for s in summaries)
    assert run["totals"]["tokens"] == sum(s["token_slots"] for s in summaries)
