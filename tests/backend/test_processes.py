"""Several server processes over one database: migrations serialised so that any number can start
at once, and `packscope serve`'s worker processes stop when it dies (even by SIGKILL)."""

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from sqlalchemy import inspect

from packscope.backend.store.db import make_engine
from tests.backend.uvicorn_server import free_port

PROCESSES = 4
# Each process waits until the same moment, then migrates: as servers started together do.
MIGRATE_AT = """
import sys, time
from packscope.backend.store.db import make_engine, upgrade_schema
url, at = sys.argv[1], float(sys.argv[2])
engine = make_engine(url)
time.sleep(max(0.0, at - time.time()))
upgrade_schema(engine)
"""


@pytest.mark.slow
def test_servers_that_start_together_all_migrate_one_database(database_url):
    # The issue: two `packscope serve` at once on a fresh database, one exits 2 (SQLite "database
    # is locked", PostgreSQL a duplicate key on alembic_version).
    at = time.time() + 4  # after every interpreter has imported the backend
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", MIGRATE_AT, database_url, str(at)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT
        )
        for _ in range(PROCESSES)
    ]
    outputs = [p.communicate(timeout=120)[0].decode() for p in processes]
    assert [p.returncode for p in processes] == [0] * PROCESSES, "\n".join(outputs)
    engine = make_engine(database_url)
    assert {"runs", "intervals", "alembic_version"} <= set(inspect(engine).get_table_names())
    engine.dispose()


def children_of(pid: int) -> list[int]:
    found = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in found]


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(") ")[1][0]
    except FileNotFoundError:
        return False
    return state != "Z"


def serve(url: str, port: int, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
    env = {**(env or os.environ), "PACKSCOPE_INGEST_TOKEN": "", "PACKSCOPE_READ_TOKEN": ""}
    command = [sys.executable, "-m", "packscope", "serve", "--port", str(port), "--workers", "2"]
    return subprocess.Popen([*command, "--database-url", url, "--no-access-log"], env=env, stderr=subprocess.PIPE)


def wait_until_serving(process: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            # Any answer (a 401 from a server with a read token too) means it serves.
            if httpx.get(f"http://127.0.0.1:{port}/api/v1/catalogue", timeout=1).status_code < 500:
                return
        except httpx.HTTPError:
            assert process.poll() is None, process.stderr.read().decode() if process.stderr else ""
            assert time.monotonic() < deadline, "the server did not start"
            time.sleep(0.2)


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_killing_serve_stops_its_workers_and_a_restart_binds_the_port(sqlite_url):
    # The issue: kill -9 of `serve` left its two workers serving as orphans, and a restart then
    # failed with "Address already in use".
    port = free_port()
    first = serve(sqlite_url, port)
    wait_until_serving(first, port)
    workers = children_of(first.pid)
    assert len(workers) >= 2, workers  # the two workers (and any helper process)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    deadline = time.monotonic() + 15
    while any(alive(pid) for pid in workers):
        assert time.monotonic() < deadline, f"workers {[p for p in workers if alive(p)]} outlived their parent"
        time.sleep(0.1)
    second = serve(sqlite_url, port)
    try:
        wait_until_serving(second, port)
    finally:
        second.terminate()
        second.wait(20)


def test_serve_on_a_busy_port_says_so_before_it_touches_a_database(tmp_path):
    """Before: "dashboard at http://…" was printed and ./packscope.db created, then uvicorn failed
    with "Address already in use" (exit 3)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PACKSCOPE_")}
        done = subprocess.run(
            [sys.executable, "-m", "packscope", "serve", "--port", str(port)],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert done.returncode == 2, done.stderr
    assert f"cannot listen on 127.0.0.1:{port}" in done.stderr and "pass --port" in done.stderr
    assert "dashboard at" not in done.stderr
    assert list(tmp_path.iterdir()) == []  # no packscope.db, no lock file


# Run first by every Python process of the test's server (through PYTHONPATH): the spawned worker
# processes start this much slower than uvicorn's own 5 s health check allows.
SLOW_WORKER_START = """
import sys, time
if "--multiprocessing-fork" in sys.argv:
    time.sleep(7)
"""


@pytest.mark.slow
def test_workers_that_start_slower_than_uvicorns_health_check_still_serve(sqlite_url, tmp_path):
    # The issue: on a loaded machine (load 13-17) `packscope serve --workers 2` never answered:
    # uvicorn killed each worker that was not ready within 5 s and started another, for ever.
    (tmp_path / "sitecustomize.py").write_text(SLOW_WORKER_START)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))}
    server = serve(sqlite_url, port, env=env)
    try:
        wait_until_serving(server, port)
    finally:
        server.terminate()
        server.wait(20)
    assert b"died" not in (server.stderr.read() if server.stderr else b"")
