"""Alerts with two server processes on one PostgreSQL database: both judge every run (each batch
wakes the process that stored it, and both sweep the live runs every 0.2 s) and both send the
outbox, yet each alert opens once and the receiver gets exactly one message per open and per
resolve."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator

import httpx
import pytest
from alert_receiver import Receiver
from wire_records import packed_interval

from packscope.backend.alerts.rules import Thresholds
from tests.backend.conftest import run_body
from tests.backend.uvicorn_server import free_port

T = Thresholds()
BASE = T.warmup_intervals + T.baseline_intervals
SECRET = "s3cret"


def serve(url: str, port: int, hook: str) -> subprocess.Popen[bytes]:
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("PACKSCOPE_")},
        "PACKSCOPE_ALERT_WEBHOOK_URL": hook,
        "PACKSCOPE_ALERT_WEBHOOK_SECRET": SECRET,
        "PACKSCOPE_ALERT_SWEEP_S": "0.2",
        "PACKSCOPE_ALERT_JUDGE_GAP_S": "0.2",
        "PACKSCOPE_ALERT_DELIVERY_POLL_S": "0.05",
    }
    command = [sys.executable, "-m", "packscope", "serve", "--port", str(port), "--workers", "1"]
    return subprocess.Popen([*command, "--database-url", url, "--no-access-log"], env=env, stderr=subprocess.PIPE)


@pytest.fixture
def two_servers(postgres: str) -> Iterator[tuple[list[str], Receiver]]:
    receiver = Receiver(SECRET)
    ports = [free_port(), free_port()]
    processes = []
    try:
        for port in ports:  # one after the other: the first migrates the database
            process = serve(postgres, port, receiver.url)
            processes.append(process)
            deadline = time.monotonic() + 60
            while True:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=1).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
                assert time.monotonic() < deadline, "the server did not start"
                time.sleep(0.2)
        yield [f"http://127.0.0.1:{port}" for port in ports], receiver
    finally:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait(timeout=20)
        receiver.close()


def send(base: str, run_id: str, records: list[dict]) -> None:
    answer = httpx.post(
        f"{base}/api/v1/runs/{run_id}/intervals",
        content=json.dumps({"intervals": records}),
        headers={"Content-Type": "application/json"},
        timeout=10,
    )
    assert answer.status_code == 200, answer.text


def wait_until(condition, timeout_s: float = 20.0, seen=lambda: None) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out; seen: {seen()}"
        time.sleep(0.05)


@pytest.mark.postgres
@pytest.mark.slow
@pytest.mark.alone  # its slowdown must be judged while open: 0.1 s between intervals, 0.2 s between judging rounds
def test_two_processes_open_each_alert_once_and_send_each_message_once(two_servers):
    bases, receiver = two_servers
    hardware = {"gpu_name": "NVIDIA H200", "gpu_count": 1, "peak_tflops": 989.0}
    assert httpx.post(f"{bases[0]}/api/v1/runs", json=run_body("slow-run", hardware=hardware)).status_code == 201
    runs = [f"failing-{i}" for i in range(12)]
    for i, run_id in enumerate(runs):
        assert httpx.post(f"{bases[i % 2]}/api/v1/runs", json=run_body(run_id)).status_code == 201
    # A slowdown that opens and resolves, its intervals sent to either process in turn.
    n = T.slowdown_intervals
    times = [0.5] * BASE + [0.8] * n + [0.5] * n
    for k, gpu_time_s in enumerate(times):
        send(bases[k % 2], "slow-run", [packed_interval(k, gpu_time_s=gpu_time_s, loss=2.0)])
        time.sleep(0.1)  # both processes judge between two intervals (their sweeps)
    # Twelve runs fail at once, half through each process: twelve crashed alerts to send together.
    for i, run_id in enumerate(runs):
        assert httpx.patch(f"{bases[i % 2]}/api/v1/runs/{run_id}", json={"status": "failed"}).status_code == 200
    wait_until(lambda: len(receiver.messages) >= 2 + len(runs), timeout_s=60, seen=receiver.events)
    time.sleep(2.0)  # ten sweeps and forty outbox polls of each process later, nothing more came
    ids = Counter(m["headers"]["X-Packscope-Event-Id"] for m in receiver.messages)
    assert set(ids.values()) == {1}, ids
    events = Counter(
        (m["json"]["event"], m["json"]["alert"]["rule"], m["json"]["alert"]["run_id"]) for m in receiver.messages
    )
    assert events == Counter(
        {("alert.opened", "slowdown", "slow-run"): 1, ("alert.resolved", "slowdown", "slow-run"): 1}
        | {("alert.opened", "crashed", run_id): 1 for run_id in runs}
    )
    assert all(receiver.signed(m) for m in receiver.messages)
    listed = httpx.get(f"{bases[1]}/api/v1/alerts?state=all").json()
    assert Counter(a["rule"] for a in listed) == {"crashed": len(runs), "slowdown": 1}
