"""What the command tests share: run files from a real (tiny, CPU) training, derived copies of
them, and a real server in a process of its own over a temporary SQLite file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from packscope.core.ports import free_port
from packscope.core.run_file import read_run_file, write_run_file

STEPS = 12  # one record per step (--log-every 1): 12 records a file, a few seconds of training


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without PACKSCOPE_* variables (a machine's token must not leak in)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PACKSCOPE_")}
    return {**env, **extra}


@contextmanager
def running_server(db: Path, **env: str) -> Iterator[str]:
    """`packscope serve` on a free port over the SQLite file `db`; yields its base URL."""
    port = free_port()
    command = [sys.executable, "-m", "packscope", "serve", "--host", "127.0.0.1", "--port", str(port)]
    command += ["--database-url", f"sqlite:///{db}", "--workers", "1", "--no-access-log"]
    # Not from the checkout: its alembic/ folder would shadow the alembic package.
    process = subprocess.Popen(command, env=clean_env(**env), cwd=db.parent)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                get(base, "/api/v1/runs")
                break
            except urllib.error.HTTPError:  # an answer (a 401 where reads need a token): it serves
                break
            except (urllib.error.URLError, OSError):
                assert process.poll() is None, "the server exited while starting"
                assert time.monotonic() < deadline, "the server did not answer within 60 s"
                time.sleep(0.1)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=15)


def get(base: str, path: str) -> Any:
    with urllib.request.urlopen(base + path, timeout=10) as resp:
        return json.loads(resp.read())


def get_status(base: str, path: str) -> int:
    try:
        with urllib.request.urlopen(base + path, timeout=10) as resp:
            return resp.status
    except urllib.error.HTTPError as err:
        return err.code


def train(out: Path, layout: str, name: str) -> Path:
    """`packscope train` on the CPU with --records-dir; the run file it wrote."""
    out.mkdir(parents=True)
    command = [sys.executable, "-m", "packscope", "train", "--device", "cpu", "--layout", layout, "--name", name]
    command += ["--steps", str(STEPS), "--log-every", "1", "--pack-length", "64", "--packs-per-step", "2"]
    command += ["--no-progress", "--records-dir", str(out)]
    home = out / "home"  # the agent's spool directory lives under ~
    home.mkdir()
    env = clean_env(HOME=str(home), OMP_NUM_THREADS="1")
    done = subprocess.run(command, capture_output=True, text=True, timeout=300, env=env, cwd=out)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out / "rank0.jsonl"


def derived(src: Path, dst: Path, run_id: str, records: Any = None, **run: Any) -> Path:
    """A copy of a run file under another run_id (and run-line changes), so tests do not share runs;
    `records` maps the list of records to the one to write."""
    original = read_run_file(src)
    body = {**original.run, "run_id": run_id, **run}
    return write_run_file(dst, body, records(original.records) if records else original.records)
