"""`packscope alerts` against a live server, and the alert rules on the reference trainer's CPU runs
(the demo's runs, in small): no rule fires on them, judged after every interval, but a slowdown
the records show."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from cli.support import derived, get
from packscope.backend.alerts.rules import Thresholds
from packscope.backend.alerts.worker import run_pks_of
from packscope.backend.http.settings import Settings
from packscope.backend.server.app import create_app
from packscope.commands.cli import main
from packscope.core.flops import ModelSpec
from packscope.core.run_file import read_run_file


def _work_rate(spec: ModelSpec, record: dict[str, Any], layout: str) -> float:
    """FLOP/s of the work that ran (docs/flops.md's T·C_lin + Σ s²·C_core, not the server's catalogue):
    the padded rows' count on bshd, the documents' on thd."""
    return (record["tokens"] * spec.c_lin + record[f"seqlen_sq_sum_{layout}"] * spec.c_core_by_kind["full"]) / record[
        "gpu_time_s"
    ]


def test_no_rule_fires_on_the_reference_cpu_runs_judged_after_every_interval(trained, tmp_path: Path):
    """No rule fires on a healthy run. The one exception these millisecond CPU steps allow: a
    machine busy with other tests can really slow a few of them, and a slowdown alert is then
    true; it is checked against the records (each interval it names below the baseline's median
    rate by the threshold), not excused."""
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'a.db'}", ingest_token=None, read_token=None))
    t = Thresholds()
    with TestClient(app) as client:
        worker = app.state.alerts
        for layout in ("thd", "bshd"):
            run_file = read_run_file(trained[layout])
            run = {k: v for k, v in run_file.run.items() if k not in ("status", "ended_at")}
            spec = ModelSpec.from_dict(run["model"])
            assert set(spec.c_core_by_kind) == {"full"}, spec.c_core_by_kind  # _work_rate's assumption
            assert client.post("/api/v1/runs", json=run).status_code == 201
            for record in run_file.records:
                body = json.dumps({"intervals": [record]})
                answer = client.post(
                    f"/api/v1/runs/{run['run_id']}/intervals",
                    content=body,
                    headers={"Content-Type": "application/json"},
                )
                assert answer.status_code == 200, answer.text
                worker.judge_now(run_pks_of(app.state.engine, [run["run_id"]]))
            fired = client.get(f"/api/v1/runs/{run['run_id']}/alerts").json()
            assert all(a["rule"] == "slowdown" for a in fired), (layout, fired)
            by_interval = {r["interval"]: r for r in run_file.records}
            first = t.warmup_intervals
            baseline = statistics.median(
                _work_rate(spec, by_interval[k], layout) for k in range(first, first + t.baseline_intervals)
            )
            for alert in fired:
                rates = [_work_rate(spec, by_interval[k], layout) for k in alert["details"]["intervals"]]
                assert all(r < baseline * (1 - t.slowdown_pct / 100) for r in rates), (layout, alert, baseline, rates)


def test_packscope_alerts_lists_the_open_alerts(
    trained, server: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
):
    assert main(["alerts", "--server", server]) == 0
    assert capsys.readouterr().out.strip() == "no open alerts"
    failed = derived(trained["thd"], tmp_path / "failed.jsonl", "cli-alerts-failed", status="failed", name="broken")
    assert main(["import", str(failed), "--server", server]) == 0
    capsys.readouterr()
    deadline = time.monotonic() + 15
    while not get(server, "/api/v1/alerts") and time.monotonic() < deadline:  # judged off the request
        time.sleep(0.05)
    opened = get(server, "/api/v1/alerts")
    # The records are a CPU run's: on a busy machine a few of its steps can be really slow, and a
    # true slowdown alert then stands beside the crash (test_no_rule_fires_... checks those).
    (alert,) = [a for a in opened if a["rule"] != "slowdown"]
    assert alert["rule"] == "crashed" and alert["run_id"] == "cli-alerts-failed"
    assert main(["alerts", "--server", server]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["opened", "run", "rule", "subject", "summary"]
    crashed = [line for line in lines[1:] if " crashed " in line]
    assert len(crashed) == 1 and "broken (cli-alerts-failed)" in crashed[0] and alert["summary"] in crashed[0]
    assert len(lines) == 1 + len(opened)


def test_packscope_alerts_says_when_no_server_answers(capsys: pytest.CaptureFixture[str]):
    assert main(["alerts", "--server", "http://127.0.0.1:9"]) == 1
    assert "cannot reach the packscope server" in capsys.readouterr().err
