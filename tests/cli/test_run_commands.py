"""The commands as a new user types them: `packscope export --run` with a run's name or the start of
its id (and, when nothing matches, the closest runs), server URLs refused before anything is
sent, and `packscope demo` linking its live runs before they train and taking its server with it
when it is stopped."""

from __future__ import annotations

import json
import queue
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from cli.support import clean_env, free_port, get, get_status, running_server
from packscope.cli import main

MODEL = {"layers": 2, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 256}


def post(base: str, path: str, body: dict) -> int:
    request = urllib.request.Request(
        base + path, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}, method="POST"
    )
    with urllib.request.urlopen(request, timeout=10) as resp:
        return resp.status


@pytest.fixture(scope="module")
def runs(server: str) -> str:
    """Three runs: two named alike, one whose name two share."""
    for run_id, name in (
        ("demo-thd-20261201-101010-aaaaaa", "demo-thd"),
        ("demo-bshd-20261201-101010-bbbbbb", "demo-bshd"),
        ("sweep-1-cccccc", "sweep"),
        ("sweep-2-dddddd", "sweep"),
    ):
        body = {"run_id": run_id, "name": name, "model": MODEL, "layout": "thd"}
        assert post(server, "/api/v1/runs", body) == 201
    return server


def export(server: str, run: str, out: Path, capsys) -> tuple[int, str]:
    code = main(["export", "--server", server, "--run", run, "-o", str(out)])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    ("given", "run_id"),
    [
        ("demo-thd", "demo-thd-20261201-101010-aaaaaa"),  # its name, as the dashboard shows it
        ("demo-bshd-2026", "demo-bshd-20261201-101010-bbbbbb"),  # a unique start of its id
        ("sweep-2-dddddd", "sweep-2-dddddd"),  # its id
    ],
)
def test_export_takes_a_name_or_an_id_prefix(runs, tmp_path, capsys, given, run_id):
    out = tmp_path / "run.csv"
    code, err = export(runs, given, out, capsys)
    assert code == 0, err
    assert out.read_text().startswith("interval,rank,")
    assert f"of run '{run_id}'" in err


def test_export_names_what_a_name_matches_when_it_is_not_one_run(runs, tmp_path, capsys):
    code, err = export(runs, "sweep", tmp_path / "x.csv", capsys)
    assert code == 2
    assert "2 runs named 'sweep'" in err and "sweep-1-cccccc" in err and "sweep-2-dddddd" in err
    code, err = export(runs, "demo-", tmp_path / "x.csv", capsys)
    assert code == 2 and "2 runs whose id starts with 'demo-'" in err
    assert not (tmp_path / "x.csv").exists()


def test_export_suggests_the_closest_runs_when_nothing_matches(runs, tmp_path, capsys):
    code, err = export(runs, "demo-thdd", tmp_path / "x.csv", capsys)
    assert code == 2
    assert "no run is stored" in err and "'demo-thdd'" in err
    assert "the closest:\n  demo-thd-20261201-101010-aaaaaa (demo-thd)" in err
    code, err = export(runs, "zzzzzzzz", tmp_path / "x.csv", capsys)
    assert code == 2 and "/api/v1/runs lists the runs" in err


def test_export_refuses_a_url_without_a_scheme_before_asking(tmp_path, capsys):
    code, err = export("127.0.0.1:9", "demo-thd", tmp_path / "x.csv", capsys)
    assert code == 2
    assert "must be a URL like http://127.0.0.1:8000" in err and "did you mean http://127.0.0.1:9?" in err


class Lines:
    """A process's stdout, line by line, read by a thread of its own (a select on the pipe would
    miss lines that Python's buffer already holds)."""

    def __init__(self, process: subprocess.Popen) -> None:
        self.lines: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        threading.Thread(target=self._read, args=(process,), daemon=True).start()

    def _read(self, process: subprocess.Popen) -> None:
        assert process.stdout is not None
        for line in process.stdout:
            self.lines.put(line)

    def until(self, marker: str, timeout_s: float) -> list[str]:
        """The lines up to (and with) the first one holding `marker`."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=0.5)
            except queue.Empty:
                continue
            self.seen.append(line)
            if marker in line:
                return self.seen
        raise AssertionError(f"{marker!r} never came:\n" + "".join(self.seen))


@pytest.mark.slow  # a server and a training process: about 20 s here
@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_the_demo_links_its_live_runs_first_and_takes_its_server_with_it(tmp_path, stop):
    port = free_port()
    db = tmp_path / "demo.db"
    gallery = tmp_path / "gallery"
    gallery.mkdir()
    command = [sys.executable, "-m", "packscope", "demo", "--port", str(port), "--database-url", f"sqlite:///{db}"]
    command += ["--gallery", str(gallery), "--steps", "400", "--log-every", "2"]
    env = clean_env(OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1")  # HOME: the test's own (tests/conftest.py)
    demo = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, cwd=tmp_path)
    base = f"http://127.0.0.1:{port}"
    try:
        lines = Lines(demo).until("Live:", 120)
        out = "".join(lines)
        assert "loss" not in out  # printed before the first run has trained
        links = [line.split()[-1] for line in lines if line.strip().startswith(("bshd:", "thd:"))]
        assert [link.split("/runs/")[0] for link in links] == [base, base]
        first = links[0].split("/runs/")[1]
        # The first run's page fills while it trains.
        deadline = time.monotonic() + 60
        while get_status(base, f"/api/v1/runs/{first}") != 200 or not get(base, f"/api/v1/runs/{first}")["records"]:
            assert time.monotonic() < deadline, "the first live run never reached the server"
            time.sleep(0.5)
        assert get_status(base, f"/runs/{first}") == 200
        demo.send_signal(stop)
        assert demo.wait(timeout=30) in (0, 1, -stop), "the demo did not end"
        deadline = time.monotonic() + 15
        while True:  # the server went with it
            try:
                get(base, "/api/v1/runs")
            except OSError:
                break
            assert time.monotonic() < deadline, "the demo's server is still serving"
            time.sleep(0.3)
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait()
    with running_server(db) as server:
        run = get(server, f"/api/v1/runs/{first}")
        assert run["status"] == "failed" and run["records"] > 0  # stopped mid-run, and it says so
