"""The commands as a new user types them: `packscope export --run` with a run's name or the start of
its id (and, when nothing matches, the closest runs), with the bare package (no server extra),
server URLs refused before anything is sent, and `packscope demo` linking its live runs before
they train and taking its server with it when it is stopped."""

from __future__ import annotations

import csv
import http.server
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
from wire_records import packed_interval

from cli.support import clean_env, free_port, get, get_status, running_server
from packscope.commands.cli import main

MODEL = {"layers": 2, "hidden": 64, "heads": 4, "ffn": 128, "vocab": 256}


def post(base: str, path: str, body: dict, token: str | None = None) -> int:
    headers = {"Content-Type": "application/json"} | ({"Authorization": f"Bearer {token}"} if token else {})
    request = urllib.request.Request(base + path, data=json.dumps(body).encode(), headers=headers, method="POST")
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


# What the server extra brings, and the backend itself: `packscope export` imports none of them.
SERVER_SIDE = ("packscope.backend", "fastapi", "starlette", "uvicorn", "sqlalchemy", "pydantic", "httpx", "numpy")


def test_export_runs_with_the_bare_package(runs, tmp_path):
    """Where the server extra is not installed (its modules fail to import), `packscope export`
    still resolves the run by its name and writes every interval."""
    body = {"run_id": "bare-export-eeeeee", "name": "bare-export", "model": MODEL, "layout": "thd"}
    assert post(runs, "/api/v1/runs", body) == 201
    records = [packed_interval(k) for k in range(3)]
    assert post(runs, "/api/v1/runs/bare-export-eeeeee/intervals", {"intervals": records}) == 200
    out = tmp_path / "bare.csv"
    argv = ["export", "--server", runs, "--run", "bare-export", "-o", str(out)]
    code = f"""import sys
for name in {SERVER_SIDE!r}:
    sys.modules[name] = None  # import raises ImportError, as for a package not installed
from packscope.commands.cli import main
sys.exit(main({argv!r}))
"""
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=clean_env(), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    with out.open(newline="") as f:
        assert [int(row["interval"]) for row in csv.DictReader(f)] == [0, 1, 2]
    assert "wrote 3 intervals of run 'bare-export-eeeeee'" in done.stderr


def test_export_writes_to_stdout(runs, capsys):
    assert main(["export", "--server", runs, "--run", "demo-thd", "-o", "-"]) == 0
    assert capsys.readouterr().out.startswith("interval,rank,")


def test_export_says_when_no_server_answers(tmp_path, capsys):
    closed = f"http://127.0.0.1:{free_port()}"  # nothing listens on it
    code, err = export(closed, "demo-thd", tmp_path / "x.csv", capsys)
    assert code == 1
    assert f"cannot reach the packscope server at {closed}" in err and "is `packscope serve` running there?" in err
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "x.csv.part").exists()


def test_export_sends_the_read_token(tmp_path, capsys):
    tokens = {"PACKSCOPE_READ_TOKEN": "r3ad", "PACKSCOPE_INGEST_TOKEN": "1ngest"}
    with running_server(tmp_path / "tokens.db", **tokens) as server:
        body = {"run_id": "guarded-ffffff", "name": "guarded", "model": MODEL, "layout": "thd"}
        assert post(server, "/api/v1/runs", body, token="1ngest") == 201
        out = tmp_path / "guarded.csv"
        code, err = export(server, "guarded", out, capsys)
        assert code == 2 and f"{server} needs a read token; pass --token" in err
        code = main(["export", "--server", server, "--run", "guarded", "--token", "r3ad", "-o", str(out)])
        assert code == 0 and out.read_text().startswith("interval,rank,")


class RefusesTheCsv(http.server.BaseHTTPRequestHandler):
    """A server that knows the run but answers its CSV with a 503."""

    def do_GET(self) -> None:
        status, body = (503, b"shedding load") if self.path.endswith(".csv") else (200, b"{}")
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


def test_export_says_what_the_server_answered_instead_of_the_csv(tmp_path, capsys):
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), RefusesTheCsv) as refusing:
        threading.Thread(target=refusing.serve_forever, daemon=True).start()
        server = f"http://127.0.0.1:{refusing.server_address[1]}"
        code, err = export(server, "run-1", tmp_path / "x.csv", capsys)
        refusing.shutdown()
    assert code == 2
    assert f"{server}/api/v1/runs/run-1/intervals.csv answered HTTP 503: b'shedding load'" in err
    assert not (tmp_path / "x.csv").exists() and not (tmp_path / "x.csv.part").exists()


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
