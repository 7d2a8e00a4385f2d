"""`packscope alerts` against a live server, and the alert rules on the reference trainer's CPU runs
(the demo's runs, in small): no rule fires on them, judged after every interval."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from cli.support import derived, get
from packscope.backend.alerts.worker import run_pks_of
from packscope.backend.http.settings import Settings
from packscope.backend.server.app import create_app
from packscope.commands.cli import main
from packscope.core.run_file import read_run_file


def test_no_rule_fires_on_the_reference_cpu_runs_judged_after_every_interval(trained, tmp_path: Path):
    app = create_app(Settings(database_url=f"sqlite:///{tmp_path / 'a.db'}", ingest_token=None, read_token=None))
    with TestClient(app) as client:
        worker = app.state.alerts
        for layout in ("thd", "bshd"):
            run_file = read_run_file(trained[layout])
            run = {k: v for k, v in run_file.run.items() if k not in ("status", "ended_at")}
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
                assert client.get("/api/v1/alerts?state=all").json() == [], (layout, record["interval"])


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
    (alert,) = get(server, "/api/v1/alerts")
    assert alert["rule"] == "crashed" and alert["run_id"] == "cli-alerts-failed"
    assert main(["alerts", "--server", server]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[0].split() == ["opened", "run", "rule", "subject", "summary"]
    assert "broken (cli-alerts-failed)" in lines[1] and " crashed " in lines[1] and alert["summary"] in lines[1]
    assert len(lines) == 2


def test_packscope_alerts_says_when_no_server_answers(capsys: pytest.CaptureFixture[str]):
    assert main(["alerts", "--server", "http://127.0.0.1:9"]) == 1
    assert "cannot reach the packscope server" in capsys.readouterr().err
