"""Alerts end to end (issue 37): the reference trainer on the CPU with an injected fault
(`packscope train --fault`, docs/trainer.md) -> a live `packscope serve` -> a webhook receiver in
the test. For each rule the alert opens within the intervals docs/alerts.md documents, the
receiver gets exactly one signed open and one signed resolve, and the API lists the alert; a
change of the document-length mix fires no slowdown. Each test runs against one server process on
SQLite, and again against two processes on one PostgreSQL database (marked slow).

The thresholds are the documented rules with shorter streaks and baselines (FAST), so that a run
of a few seconds can open and resolve each; the CPU's step times swing with the machine's load,
so the rate thresholds are wide and the faults strong (a 10x slowdown against an 80% threshold).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import warnings
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from unittest import mock

import httpx
import pytest
import torch
import torch.distributed as dist
from alert_receiver import Receiver
from browser_support import CHROMIUM, CHROMIUM_ARGS, require_chromium
from playwright import sync_api

from packscope.agent.syncs import SYNC_WARNING
from packscope.core.ports import free_port
from packscope.trainer.config import DataConfig, TrainConfig
from packscope.trainer.train import run_training
from tests.backend.conftest import postgres  # noqa: F401  (the fixture, for the two-process case)

# Every test here bounds when an alert opens or resolves against the trainer's intervals, which a
# busy machine's slow server can break: the module runs in the serial pass after the parallel one.
pytestmark = pytest.mark.alone

SECRET = "e2e-secret"
LOG_EVERY = 4  # steps per interval: interval k holds steps 4k+1 .. 4k+4
FAST = {
    "warmup_intervals": 1,
    "baseline_intervals": 3,  # intervals 1-3 are the baseline: a fault starts at interval 5 (step 21)
    "slowdown_pct": 80.0,
    "slowdown_intervals": 2,
    "straggler_pct": 100.0,
    "straggler_intervals": 2,
    "sync_intervals": 2,
    "nonfinite_resolve_intervals": 2,
    "mfu_floor_intervals": 2,
    # A 10x slowdown's intervals come 10x as far apart, which 5 gaps would call a stall, and on a
    # busy machine they can be seconds apart: the stall's own test sets STALL for its project.
    "stalled_floor_s": 30.0,
    "stalled_gap_factor": 20.0,
}
STALL = {"stalled_floor_s": 4.0, "stalled_gap_factor": 5.0, "stalled_resolve_intervals": 2}
FAULT_STEP = 21  # the first step of interval 5
FAULT_INTERVAL = (FAULT_STEP - 1) // LOG_EVERY
# The sweep (0.2 s), judging rounds at least 0.2 s apart, the sender's batching: seconds at most.
JUDGING_LAG_S = 2.0
SETTLE_S = 2.0  # after the expected messages: ten sweeps and forty outbox polls, for any extra one
TRAIN_ARGS = [
    "--device", "cpu", "--preset", "tiny", "--pack-length", "128", "--packs-per-step", "2",
    "--log-every", str(LOG_EVERY), "--no-progress", "--data-short-median", "24", "--data-long-median", "96",
]  # fmt: skip


# -- the servers and the receiver ------------------------------------------------------------------
@dataclass
class Alerting:
    urls: list[str]  # one per server process; the trainer sends to the first
    receiver: Receiver
    processes: list[subprocess.Popen[bytes]]

    @property
    def url(self) -> str:
        return self.urls[0]

    def get(self, path: str, **params: Any) -> Any:
        answer = httpx.get(self.urls[-1] + path, params=params, timeout=10)  # reads from the last process
        assert answer.status_code == 200, (path, answer.status_code, answer.text)
        return answer.json()

    def set_thresholds(self, project: str, **values: Any) -> None:
        answer = httpx.patch(f"{self.url}/api/v1/alerts/settings", params={"project": project}, json=values, timeout=10)
        assert answer.status_code == 200, answer.text

    def messages(self, run_id: str) -> list[dict[str, Any]]:
        return [m for m in list(self.receiver.messages) if m["json"]["alert"]["run_id"] == run_id]

    def wait_for_messages(self, run_id: str, count: int, timeout_s: float = 60.0) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        while len(self.messages(run_id)) < count:
            got = [(m["json"]["event"], m["json"]["alert"]["rule"]) for m in self.messages(run_id)]
            assert time.monotonic() < deadline, f"{got} after {timeout_s} s, expected {count} messages"
            time.sleep(0.05)
        time.sleep(SETTLE_S)
        return self.messages(run_id)


def serve(database_url: str, port: int, hook: str) -> subprocess.Popen[bytes]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PACKSCOPE_")},
        "PACKSCOPE_ALERT_WEBHOOK_URL": hook,
        "PACKSCOPE_ALERT_WEBHOOK_SECRET": SECRET,
        "PACKSCOPE_ALERT_THRESHOLDS": json.dumps(FAST),
        "PACKSCOPE_ALERT_SWEEP_S": "0.2",
        "PACKSCOPE_ALERT_JUDGE_GAP_S": "0.2",
        "PACKSCOPE_ALERT_DELIVERY_POLL_S": "0.05",
        "PACKSCOPE_ALERT_RETRY_BASE_S": "0.1",
    }
    command = [sys.executable, "-m", "packscope", "serve", "--port", str(port), "--workers", "1", "--no-access-log"]
    return subprocess.Popen([*command, "--database-url", database_url], env=env, stderr=subprocess.PIPE)


def started(process: subprocess.Popen[bytes], url: str) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/api/v1/alerts", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.2)


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.slow])])
def alerting(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Alerting]:
    """One `packscope serve` on SQLite, or two on one PostgreSQL database."""
    if request.param == "sqlite":
        database_url, count = f"sqlite:///{tmp_path / 'alerts.db'}", 1
    else:
        database_url, count = request.getfixturevalue("postgres"), 2
    receiver = Receiver(SECRET)
    processes: list[subprocess.Popen[bytes]] = []
    urls = []
    try:
        for _ in range(count):  # one after the other: the first migrates the database
            port = free_port()
            urls.append(f"http://127.0.0.1:{port}")
            processes.append(serve(database_url, port, receiver.url))
            started(processes[-1], urls[-1])
        yield Alerting(urls, receiver, processes)
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=20)
        receiver.close()


# -- the trainer -------------------------------------------------------------------------------------
def train(alerting: Alerting, run_id: str, *args: str, steps: int, ok: bool = True, **env: str) -> None:
    command = [sys.executable, "-m", "packscope", "train", *TRAIN_ARGS, "--steps", str(steps)]
    command += ["--server", alerting.url, "--run-id", run_id, "--name", run_id, "--project", project_of(run_id), *args]
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=environment)
    assert (done.returncode == 0) == ok, done.stderr[-3000:]


def project_of(run_id: str) -> str:
    return f"e2e-{run_id}"


# -- what the receiver and the API show ----------------------------------------------------------
def assert_one_open_one_resolve(alerting: Alerting, run_id: str, rule: str, subject: str = "") -> dict[str, Any]:
    """The run's messages are one open and then one resolve of `rule`, signed; the API lists that
    alert alone, resolved. Returns the alert as the API lists it."""
    messages = alerting.wait_for_messages(run_id, 2)
    events = [(m["json"]["event"], m["json"]["alert"]["rule"], m["json"]["alert"]["subject"]) for m in messages]
    assert events == [("alert.opened", rule, subject), ("alert.resolved", rule, subject)], events
    assert all(alerting.receiver.signed(m) for m in messages)
    event_ids = Counter(m["headers"]["X-Packscope-Event-Id"] for m in messages)
    assert len(event_ids) == 2 and set(event_ids.values()) == {1}, event_ids
    listed = alerting.get(f"/api/v1/runs/{run_id}/alerts")
    assert [(a["rule"], a["subject"]) for a in listed] == [(rule, subject)], listed
    assert listed[0]["resolved_at"] is not None
    assert messages[0]["json"]["alert"]["id"] == messages[1]["json"]["alert"]["id"] == listed[0]["id"]
    return listed[0]


def wall_ends(alerting: Alerting, run_id: str) -> dict[int, float]:
    """Each interval's latest wall_end over its ranks (the agent's clock: this machine's)."""
    answer = httpx.get(f"{alerting.url}/api/v1/runs/{run_id}/intervals.csv", timeout=10)
    assert answer.status_code == 200, answer.text
    lines = answer.text.splitlines()
    header = lines[0].split(",")
    ends: dict[int, float] = {}
    for line in lines[1:]:
        row = dict(zip(header, line.split(","), strict=False))
        interval = int(row["interval"])
        ends[interval] = max(ends.get(interval, 0.0), float(row["wall_end"]))
    return ends


def at(timestamp: str) -> float:
    return datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def assert_judged_on_interval(ends: dict[int, float], interval: int, when: float) -> None:
    """`when` (an alert's opening or resolving) came once `interval` had ended (not on earlier
    data) and before the interval two after it ended, or within JUDGING_LAG_S of it where
    intervals come faster (the sender's batching and the judging's lag, no more)."""
    assert ends[interval] <= when < max(ends[interval + 2], ends[interval] + JUDGING_LAG_S), (interval, when, ends)


def assert_opened_on_interval(alerting: Alerting, run_id: str, alert: dict[str, Any], interval: int) -> None:
    assert_judged_on_interval(wall_ends(alerting, run_id), interval, at(alert["opened_at"]))


# -- one test per rule -------------------------------------------------------------------------------
# The bounds on when an alert opened or resolved are wall-clock ones (the judging's lag against the
# trainer's intervals): the parallel pass on a loaded machine once judged a slowdown past its bound.
def test_slowdown_opens_after_its_streak_and_resolves_when_the_steps_are_fast_again(alerting):
    until = FAULT_STEP + 5 * LOG_EVERY  # intervals 5-9 slowed
    # 8 fast intervals after the fault: a busy machine's slow moment may break the first streak.
    train(alerting, "slow", "--fault", f"slowdown:from={FAULT_STEP},factor=10,until={until}", steps=72)
    alert = assert_one_open_one_resolve(alerting, "slow", "slowdown")
    assert_opened_on_interval(alerting, "slow", alert, FAULT_INTERVAL + FAST["slowdown_intervals"] - 1)
    ends = wall_ends(alerting, "slow")
    resolved_on = (until - 1) // LOG_EVERY + FAST["slowdown_intervals"] - 1  # the fast intervals' first streak
    assert ends[resolved_on] <= at(alert["resolved_at"])


def test_a_stall_opens_stalled_and_a_streak_of_intervals_resolves_it(alerting):
    # The stalled interval's FLOP/s is a tenth of the baseline's or less: with one slow interval
    # after it (a busy machine) the slowdown rule would open too; this test is about the stall.
    alerting.set_thresholds(project_of("stall"), **STALL, slowdown_pct=99.0)
    # Heartbeats every second all through the stall: a hung trainer's sender thread still beats.
    train(alerting, "stall", "--fault", f"stall:at={FAULT_STEP},seconds=12", steps=40, PACKSCOPE_HEARTBEAT_S="1")
    alert = assert_one_open_one_resolve(alerting, "stall", "stalled")
    ends = wall_ends(alerting, "stall")
    last_before = FAULT_INTERVAL - 1
    opened, resolved = at(alert["opened_at"]), at(alert["resolved_at"])
    assert ends[last_before] + STALL["stalled_floor_s"] <= opened < ends[last_before] + 12
    # The interval the stall is in ended 12 s late: the streak is the intervals after it.
    assert ends[FAULT_INTERVAL + STALL["stalled_resolve_intervals"]] - 1 <= resolved


def test_a_crash_opens_crashed_and_a_resume_resolves_it(alerting):
    crash_at = FAULT_STEP + 1
    train(alerting, "crash", "--fault", f"crash:at={crash_at}", steps=40, ok=False)
    opened = alerting.wait_for_messages("crash", 1)
    assert [(m["json"]["event"], m["json"]["alert"]["rule"]) for m in opened] == [("alert.opened", "crashed")]
    assert alerting.get("/api/v1/runs/crash")["status"] == "failed"
    logged = (crash_at - 1) // LOG_EVERY * LOG_EVERY  # the last step the crashed run logged
    train(alerting, "crash", "--start-step", str(logged), steps=logged + 2 * LOG_EVERY)
    assert_one_open_one_resolve(alerting, "crash", "crashed")


def test_a_nan_loss_opens_nonfinite_loss_at_once_and_finite_losses_resolve_it(alerting):
    train(alerting, "nan", "--fault", f"nan-loss:at={FAULT_STEP + 1}", steps=40)
    alert = assert_one_open_one_resolve(alerting, "nan", "nonfinite_loss")
    assert_opened_on_interval(alerting, "nan", alert, FAULT_INTERVAL)
    ends = wall_ends(alerting, "nan")
    # A CPU run's intervals can end closer together than the judging's lag: that lag bounds it.
    assert_judged_on_interval(ends, FAULT_INTERVAL + FAST["nonfinite_resolve_intervals"], at(alert["resolved_at"]))


def test_mfu_below_the_projects_floor_opens_mfu_floor_and_resolves_above_it(alerting):
    """The floor is a third of the run's own steady MFU, set once the baseline is in (the CPU's
    speed is the machine's); a 10x slowdown goes below it, and the steps after it come back above."""
    run_id, start, until = "mfu", 61, 101
    alerting.set_thresholds(project_of(run_id), slowdown_pct=99.0)  # the slowdown's own rule stays quiet here
    command = [sys.executable, "-m", "packscope", "train", *TRAIN_ARGS, "--steps", "120", "--peak-tflops", "0.05"]
    command += ["--server", alerting.url, "--run-id", run_id, "--name", run_id, "--project", project_of(run_id)]
    command += ["--fault", f"slowdown:from={start},factor=10,until={until}"]
    trainer = subprocess.Popen(command, env={**os.environ, "OMP_NUM_THREADS": "1"}, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while True:
            answer = httpx.get(f"{alerting.url}/api/v1/runs/{run_id}", timeout=10)
            summary = answer.json() if answer.status_code == 200 else {}
            steady = summary.get("steady") or {}
            if steady.get("mfu_useful") and (summary.get("last_step") or 0) >= 5 * LOG_EVERY:
                break
            assert trainer.poll() is None and time.monotonic() < deadline, "no steady MFU before the fault"
            time.sleep(0.05)
        assert (summary.get("last_step") or 0) < start - 2 * LOG_EVERY, "the floor came too late for the test"
        alerting.set_thresholds(project_of(run_id), mfu_floor=steady["mfu_useful"] / 3)
        assert trainer.wait(timeout=300) == 0, trainer.stderr.read().decode() if trainer.stderr else ""
    finally:
        if trainer.poll() is None:
            trainer.kill()
    alert = assert_one_open_one_resolve(alerting, run_id, "mfu_floor")
    assert_opened_on_interval(alerting, run_id, alert, (start - 1) // LOG_EVERY + FAST["mfu_floor_intervals"] - 1)


@pytest.mark.slow  # two torchrun ranks, each importing torch
@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo")
def test_a_slow_rank_opens_straggler_naming_it(alerting):
    run_id, until = "straggler", FAULT_STEP + 5 * LOG_EVERY
    # The others wait for rank 1 each step, so the run's FLOP/s falls by about two thirds: the
    # slowdown rule may see that too; this test is about the straggler alert.
    alerting.set_thresholds(project_of(run_id), slowdown_pct=99.0)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2"]
    command += ["-m", "packscope", "train", *TRAIN_ARGS, "--steps", "60", "--parallel", "ddp"]
    command += ["--server", alerting.url, "--run-id", run_id, "--name", run_id, "--project", project_of(run_id)]
    command += ["--fault", f"slow-rank:rank=1,factor=5,from={FAULT_STEP},until={until}"]
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stderr[-3000:]
    alert = assert_one_open_one_resolve(alerting, run_id, "straggler", "rank 1")
    assert_opened_on_interval(alerting, run_id, alert, FAULT_INTERVAL + FAST["straggler_intervals"] - 1)


# On the CPU the agent counts no syncs (tests/trainer/test_faults.py, docs/trainer.md): the trainer
# runs in this process with the counter installed as on a GPU machine and a CPU `.item()` that warns
# as PyTorch does for a CUDA tensor in sync debug mode.
TORCH_FILE = os.path.join(os.path.dirname(torch.__file__), "_fault_e2e_item.py")
# Only a read made outside torch warns: torch's own CPU code (the unfused AdamW's step counts) reads
# values that the CUDA path (fused AdamW) keeps on the device.
ITEM_SOURCE = (
    "def item(self):\n"
    "    if not sys._getframe(1).f_code.co_filename.startswith(TORCH_DIR):\n"
    "        warnings.warn(MESSAGE, UserWarning)\n"
    "    return ORIGINAL(self)\n"
)


def test_added_syncs_open_sync_regression_naming_the_faults_site(alerting):
    run_id, until = "syncs", FAULT_STEP + 5 * LOG_EVERY
    namespace: dict = {
        "warnings": warnings,
        "sys": sys,
        "TORCH_DIR": os.path.dirname(torch.__file__),
        "MESSAGE": SYNC_WARNING,
        "ORIGINAL": torch.Tensor.item,
    }
    exec(compile(ITEM_SOURCE, TORCH_FILE, "exec"), namespace)
    config = TrainConfig(
        steps=60,
        pack_length=128,
        packs_per_step=2,
        device="cpu",
        progress=False,
        log_every=LOG_EVERY,
        count_syncs_every=1,
        server=alerting.url,
        run_id=run_id,
        name=run_id,
        project=project_of(run_id),
        data=DataConfig(min_len=8, short_median=24, long_median=96),
        faults=(f"syncs:from={FAULT_STEP},count=3,until={until}",),
    )
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with (
            mock.patch("torch.cuda.is_available", return_value=True),
            mock.patch("torch.cuda.get_sync_debug_mode", return_value=0),
            mock.patch("torch.cuda.set_sync_debug_mode"),
            mock.patch.object(torch.Tensor, "item", namespace["item"]),
            warnings.catch_warnings(),
        ):
            run_training(config)
    finally:
        torch.set_num_threads(threads)
    messages = alerting.wait_for_messages(run_id, 2)
    subject = messages[0]["json"]["alert"]["subject"]
    assert subject.endswith("in added_syncs") and "faults.py:" in subject, subject
    alert = assert_one_open_one_resolve(alerting, run_id, "sync_regression", subject)
    assert_opened_on_interval(alerting, run_id, alert, FAULT_INTERVAL + FAST["sync_intervals"] - 1)


def test_a_change_of_document_mix_fires_no_slowdown(alerting):
    """From step 21 the documents come from a stream of long ones (short share 0): fewer, longer
    documents per step, the same work per second; no rule fires."""
    train(alerting, "mix", "--fault", f"mix:from={FAULT_STEP},short_share=0.0", steps=60)
    time.sleep(SETTLE_S)
    assert alerting.messages("mix") == []
    assert alerting.get("/api/v1/runs/mix/alerts") == []
    rows = httpx.get(f"{alerting.url}/api/v1/runs/mix/intervals.csv", timeout=10).text.splitlines()
    header = rows[0].split(",")
    lengths = {}
    for line in rows[1:]:
        row = dict(zip(header, line.split(","), strict=False))
        lengths[int(row["interval"])] = float(row["real_tokens"]) / float(row["documents"])
    before = [lengths[i] for i in range(FAULT_INTERVAL)]
    after = [lengths[i] for i in range(FAULT_INTERVAL, max(lengths) + 1)]
    assert min(after) > max(before), lengths  # the mix did change, as the server stored it


@pytest.mark.browser
@pytest.mark.parametrize("alerting", ["sqlite"], indirect=True)
def test_the_run_page_shows_the_open_alert_then_its_history(alerting):
    require_chromium()
    train(alerting, "page", "--fault", "crash:at=10", steps=20, ok=False)
    alerting.wait_for_messages("page", 1)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            errors: list[str] = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{alerting.url}/runs/page")
            banner = page.locator("#alerts-banner")
            assert banner.is_visible()
            assert "1 open alert" in banner.inner_text()
            assert page.locator('#alerts-open li[data-rule="crashed"]').count() == 1
            page.locator("#alerts-history summary").click()  # the history is folded
            row = page.locator("#alerts-history-body tr").first.inner_text()
            assert row.startswith("crashed") and row.split("\t")[3].strip() == "open", row
            assert errors == []
        finally:
            browser.close()
