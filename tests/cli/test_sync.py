"""`packscope sync`: what runs left on disk (the spool of a run whose server URL was wrong, an
offline run's spool, run files, any mix) reaches a real server exactly once: the server's totals
are the brute-force sums of the records the agents made; a sync killed mid-way and run again
stores everything once; a second sync sends nothing; bad input is refused before anything is sent."""

from __future__ import annotations

import json
import random
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from wire_records import packed_interval

from cli.support import clean_env, derived, free_port, get, get_status, running_server
from packscope.agent import Agent, AgentConfig, ModelSpec
from packscope.commands import importer, sync
from packscope.commands.cli import main
from packscope.core.run_file import read_run_file, write_run_file
from packscope.core.spool import Spool, encode

MODEL = ModelSpec(layers=2, hidden=64, heads=4, ffn=128, vocab=256)
SUMS = ("tokens", "real_tokens", "documents", "packs", "steps")


@pytest.fixture(autouse=True)
def _no_token_from_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(importer.TOKEN_ENV, raising=False)


def agent_run(
    spool_dir: Path, run_id: str, server: str | None, steps: int = 6, close_timeout_s: float = 0.5
) -> list[dict]:
    """A tiny CPU run with the agent; its records (the brute-force truth). With a server URL
    nothing listens on, the records stay in its spool, as a mistyped --server leaves them."""
    config = AgentConfig(
        server=server,
        run_id=run_id,
        run_name=run_id,
        log_every=1,
        spool_dir=str(spool_dir),
        count_syncs=False,
        request_timeout_s=0.5,
        retry_s=0.05,
    )
    agent = Agent(config, model=MODEL)
    g = torch.Generator().manual_seed(len(run_id))
    for _ in range(steps):
        agent.step_begin()
        lengths = torch.randint(1, 100, (5,), generator=g)
        cu = torch.cat([torch.zeros(1, dtype=torch.int64), lengths.cumsum(0)])
        agent.observe_batch(cu_seqlens=cu, shape=(1, 512))
        agent.step_end(loss=torch.tensor(2.0), lr=1e-3)
    agent.close(timeout_s=close_timeout_s)
    return list(agent.records)


def nowhere() -> str:
    return f"http://127.0.0.1:{free_port()}"  # nothing listens there


def run_sync(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main(["sync", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def assert_stored(server: str, run_id: str, records: list[dict], status: str | None = "finished") -> None:
    summary = get(server, f"/api/v1/runs/{run_id}")
    assert summary["records"] == len(records)
    for key in SUMS:
        assert summary["totals"][key] == sum(r[key] for r in records), key
    if status is not None:
        assert summary["status"] == status


def test_the_spool_of_a_run_with_a_wrong_server_url_is_stored(server, tmp_path, capsys):
    spool_dir = tmp_path / "spool"
    records = agent_run(spool_dir, "sync-wrong-url", nowhere())
    spool = spool_dir / "sync-wrong-url.sqlite"
    assert spool.exists()
    code, out, err = run_import_of(capsys, spool)
    assert code == 2 and "packscope sync" in err  # import points to sync
    code, out, err = run_sync(capsys, spool, "--server", server)
    assert code == 0, err
    assert f"{spool}: run sync-wrong-url: 6 records sent (6 accepted, 0 duplicates), status finished" in out
    assert f"run sync-wrong-url: {server}/runs/sync-wrong-url" in out
    assert_stored(server, "sync-wrong-url", records)
    assert not spool.exists()  # nothing left in it
    code, out, _ = run_sync(capsys, spool_dir, "--server", server)
    assert code == 0 and "nothing to send" in out


def test_a_run_closed_with_no_time_left_to_reach_its_server_keeps_its_final_status(server, tmp_path, capsys):
    # close()'s time ran out before the final status could be tried (a busy machine, a short
    # timeout): the status must still be kept in the spool, or sync leaves the run "running" for good.
    spool_dir = tmp_path / "spool"
    records = agent_run(spool_dir, "sync-no-time-left", nowhere(), close_timeout_s=0.0)
    code, out, err = run_sync(capsys, spool_dir / "sync-no-time-left.sqlite", "--server", server)
    assert code == 0, err
    assert "status finished" in out
    assert_stored(server, "sync-no-time-left", records, status="finished")


def run_import_of(capsys: pytest.CaptureFixture[str], path: Path) -> tuple[int, str, str]:
    code = main(["import", str(path), "--server", "http://127.0.0.1:9"])
    out, err = capsys.readouterr()
    return code, out, err


def test_spools_offline_runs_and_run_files_in_one_directory_are_each_stored_once(trained, server, tmp_path, capsys):
    root = tmp_path / "left-behind"
    offline = agent_run(root / "offline", "sync-offline", None, steps=5)
    assert (root / "offline" / "sync-offline.sqlite").exists()
    wrong = agent_run(root / "spool", "sync-mixed-wrong", nowhere(), steps=4)
    run_file = derived(trained["thd"], root / "records" / "rank0.jsonl", "sync-run-file")
    (root / "notes.jsonl").write_text("not a run file\n")  # found in the directory: skipped, said so
    code, out, err = run_sync(capsys, root, "--server", server, "--batch", "3")
    assert code == 0, err
    assert f"{root / 'notes.jsonl'}: neither a spool nor a run file; skipped" in err
    assert_stored(server, "sync-offline", offline)
    assert_stored(server, "sync-mixed-wrong", wrong)
    assert_stored(server, "sync-run-file", read_run_file(run_file).records)
    assert "\r" not in err  # not a terminal: no progress bar
    before = {run: stored(server, run) for run in ("sync-offline", "sync-mixed-wrong", "sync-run-file")}
    code, out, err = run_sync(capsys, root, "--server", server)
    assert code == 0 and "nothing to send" in out, err
    after = {run: stored(server, run) for run in before}
    assert after == before


def stored(server: str, run: str) -> dict:
    """What the server holds of a run, less its open alerts: the alert worker judges the runs on
    its own time, and a CPU run's steps may truly slow down on a busy machine (it did in CI)."""
    return {key: value for key, value in get(server, f"/api/v1/runs/{run}").items() if key != "open_alerts"}


def test_a_run_file_synced_to_one_server_is_sent_again_to_another(trained, server, tmp_path, capsys):
    run_file = derived(trained["bshd"], tmp_path / "rank0.jsonl", "sync-two-servers")
    assert run_sync(capsys, run_file, "--server", server)[0] == 0
    with running_server(tmp_path / "other.db") as other:
        code, _, err = run_sync(capsys, run_file, "--server", other)
        assert code == 0, err
        assert_stored(other, "sync-two-servers", read_run_file(run_file).records)
    assert "nothing to send" in run_sync(capsys, run_file, "--server", server)[1]


SYNC = [sys.executable, "-m", "packscope", "sync", "--batch", "1"]


def kill_mid_way(path: Path, server: str, run_id: str, total: int) -> None:
    """Start `packscope sync` in a process of its own and kill -9 it once part of the run is stored."""
    proc = subprocess.Popen([*SYNC, str(path), "--server", server], env=clean_env(), stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 60
    try:
        while stored_records(server, run_id) < 20:
            assert proc.poll() is None, "sync ended before it could be killed"
            assert time.monotonic() < deadline
            time.sleep(0.02)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert 20 <= stored_records(server, run_id) < total  # really mid-way


def settled_records(server: str, run_id: str, quiet_s: float = 0.5) -> int:
    """The run's stored records once the server has stored what it will: the request in flight at
    a client's kill may still be committed after it (its item was taken), so the count is read
    again until it holds for `quiet_s`."""
    count, since = stored_records(server, run_id), time.monotonic()
    while time.monotonic() - since < quiet_s:
        time.sleep(0.05)
        now = stored_records(server, run_id)
        if now != count:
            count, since = now, time.monotonic()
    return count


def stored_records(server: str, run_id: str) -> int:
    path = f"/api/v1/runs/{run_id}"
    return get(server, path)["records"] if get_status(server, path) == 200 else 0


@pytest.mark.slow  # a few hundred one-record requests, twice: about 10 s here
@pytest.mark.parametrize("kind", ["spool", "run file"])
def test_a_sync_killed_mid_way_and_run_again_stores_everything_once(server, tmp_path, capsys, kind):
    run_id = f"sync-killed-{kind.replace(' ', '-')}"
    spool_dir = tmp_path / "spool"
    records = agent_run(spool_dir, run_id, None, steps=150)
    path = spool_dir / f"{run_id}.sqlite"
    if kind == "run file":
        db_run = get_run_body(path)
        path.unlink()
        path = write_run_file(tmp_path / "rank0.jsonl", db_run, records)
    kill_mid_way(path, server, run_id, len(records))
    stored_before = settled_records(server, run_id)
    code, out, err = run_sync(capsys, path, "--server", server)
    assert code == 0, err
    assert_stored(server, run_id, records)
    accepted, duplicates = map(int, re.search(r"\((\d+) accepted, (\d+) duplicates\)", out).groups())
    assert accepted == len(records) - stored_before
    assert duplicates <= 1  # at most the one-record batch in flight at the kill is sent again
    assert "nothing to send" in run_sync(capsys, path.parent, "--server", server)[1]


def get_run_body(spool: Path) -> dict:
    db = sqlite3.connect(spool)
    try:
        return json.loads(db.execute("SELECT value FROM meta WHERE key = 'run'").fetchone()[0])
    finally:
        db.close()


def test_bad_input_is_refused_before_anything_is_sent(server, tmp_path, capsys):
    records = agent_run(tmp_path / "spool", "sync-never-sent", None, steps=2)
    assert len(records) == 2
    text = tmp_path / "notes.txt"
    text.write_text("hello\n")
    foreign = tmp_path / "other.sqlite"
    db = sqlite3.connect(foreign)
    db.execute("CREATE TABLE t (x)")
    db.close()
    code, _, err = run_sync(capsys, tmp_path / "spool", text, foreign, tmp_path / "missing", "--server", server)
    assert code == 2
    assert f"{text}: neither a packscope spool" in err
    assert f"{foreign}: an SQLite file, but not a packscope spool" in err
    assert f"{tmp_path / 'missing'}: no such file or directory" in err
    assert "nothing was sent" in err
    assert get_status(server, "/api/v1/runs/sync-never-sent") == 404
    for bad in ("127.0.0.1:8000", "ftp://host/", "http://:80", "http://host:port"):
        code, _, err = run_sync(capsys, tmp_path / "spool", "--server", bad)
        assert code == 2 and ("is not a server URL" in err or "port" in err), (bad, err)
    assert get_status(server, "/api/v1/runs/sync-never-sent") == 404
    code, _, err = run_sync(capsys, tmp_path / "spool", "--server", nowhere())
    assert code == 1 and "cannot reach the packscope server" in err
    assert (tmp_path / "spool" / "sync-never-sent.sqlite").exists()  # kept for the next try


def test_sync_needs_neither_torch_nor_the_agent_nor_the_server():
    code = "import sys, packscope.commands.sync; print(' '.join(sorted(sys.modules)))"
    modules = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert not [m for m in modules if m.split(".")[0] in ("torch", "numpy", "httpx", "fastapi", "sqlalchemy")]
    assert not [m for m in modules if m.startswith(("packscope.agent", "packscope.backend", "packscope.trainer"))]


def test_a_record_the_server_refuses_is_set_aside_and_tried_again_within_its_caps(server, tmp_path, capsys):
    spool_dir = tmp_path / "spool"
    records = agent_run(spool_dir, "sync-refused", None, steps=6)
    spool = spool_dir / "sync-refused.sqlite"
    db = sqlite3.connect(spool)
    with db:  # interval 3 as a server refuses it: negative tokens
        ((row_id, body),) = db.execute("SELECT id, body FROM records WHERE body LIKE '%\"interval\":3,%'")
        db.execute("UPDATE records SET body = ? WHERE id = ?", (json.dumps({**json.loads(body), "tokens": -1}), row_id))
    db.close()
    code, out, err = run_sync(capsys, spool, "--server", server, "--batch", "4")
    assert code == 2, err
    assert "interval 3 refused and set aside" in out and "stay set aside in their spool" in err
    assert_stored(server, "sync-refused", [r for r in records if r["interval"] != 3])
    # Each later sync tries it once more, until it has failed SET_ASIDE_MAX_ATTEMPTS (5) times.
    for _ in range(4):
        code, out, err = run_sync(capsys, spool, "--server", server)
        assert code == 2 and "1 set aside before refused again" in out, err
    code, out, err = run_sync(capsys, spool, "--server", server)
    assert code == 0 and "nothing to send" in out
    assert f"{spool}: 1 records set aside past their retry caps stay in it" in err
    db = sqlite3.connect(spool)
    assert db.execute("SELECT attempts, kind FROM set_aside").fetchall() == [(5, "rejected")]  # kept, with its reason
    db.close()


def test_a_final_status_left_alone_in_a_spool_is_set(server, tmp_path, capsys):
    """Every record delivered, but not the final status: the spool keeps just that, and sync sets it."""
    records = agent_run(tmp_path / "offline", "sync-status-only", None, steps=3)
    spool = tmp_path / "offline" / "sync-status-only.sqlite"
    first = tmp_path / "first" / spool.name
    first.parent.mkdir()
    shutil.copy(spool, first)
    with sqlite3.connect(first) as db:  # the records alone reach the server...
        db.execute("DELETE FROM meta WHERE key = 'final'")
    assert run_sync(capsys, first, "--server", server)[0] == 0
    assert get(server, "/api/v1/runs/sync-status-only")["status"] == "running"
    with sqlite3.connect(spool) as db:  # ...and the spool is left with the status only
        db.execute("DELETE FROM records")
        db.execute("UPDATE totals SET records = 0, bytes = 0")
    code, out, err = run_sync(capsys, spool, "--server", server)
    assert code == 0 and "status finished" in out, err
    assert_stored(server, "sync-status-only", records, status="finished")
    assert not spool.exists()


def test_a_run_file_with_damaged_lines_sends_the_others_once_and_says_which_lines(trained, server, tmp_path, capsys):
    path = derived(trained["bshd"], tmp_path / "rank0.jsonl", "sync-damaged-lines")
    lines = path.read_bytes().split(b"\n")  # line 1: the run line; line k + 2: record k
    lines[4] = b"\x00\xffgarbage"  # line 5 (interval 3)
    path.write_bytes(b"\n".join(lines).rstrip(b"\n")[:-25])  # the last line torn, as `truncate -s -25` leaves it
    good = [r for r in read_run_file(trained["bshd"]).records if r["interval"] not in (3, len(lines) - 3)]
    code, out, err = run_sync(capsys, path, "--server", server, "--batch", "4")
    assert code == 2, err
    assert f"{path}:5: not UTF-8 text" in err and f"{path}:{len(lines) - 1}: not JSON" in err
    assert f"{len(good)} records sent ({len(good)} accepted, 0 duplicates), 2 damaged lines skipped" in out
    assert_stored(server, "sync-damaged-lines", good)
    code, out, err = run_sync(capsys, path, "--server", server)  # a retry: nothing twice, the same lines named
    assert code == 2 and f"{path}:5: not UTF-8 text" in err and "only what is named above was never sent" in err
    assert_stored(server, "sync-damaged-lines", good)


@pytest.mark.parametrize("found", ["by the check", "mid-way"])
def test_a_damaged_spool_sends_every_readable_record_once_and_says_what_was_lost(
    server, tmp_path, capsys, monkeypatch, found
):
    """The issue's spool: 2,000 records, 8 KiB overwritten mid-file. Every record that still reads
    is stored once; the ones that do not are counted, the damaged file is kept and named, the exit
    status says so, and a later sync names the kept file instead of claiming all was sent."""
    run_id = f"sync-damaged-{found.split()[-1]}"
    spool_dir = tmp_path / "spool"
    agent_run(spool_dir, run_id, None, steps=1)  # the run's registration, as the agent keeps it
    path = spool_dir / f"{run_id}.sqlite"
    spool = Spool(path, max_bytes=2**40)
    spool.open()
    spool.append([encode(packed_interval(k)) for k in range(1, 2000)])
    spool.close(remove_if_empty=False)
    with path.open("r+b") as f:
        f.seek(600 * 1024)
        f.write(random.Random(0).randbytes(8192))
    if found == "mid-way":  # as if SQLite's check had let the damage through: found by a read while sending
        monkeypatch.setattr(sync, "_sound", lambda db: True, raising=False)
    code, out, err = run_sync(capsys, spool_dir, "--server", server, "--batch", "256")
    assert code == 2, err
    stored = get(server, f"/api/v1/runs/{run_id}")["records"]
    lost = int(re.search(r"the spool was damaged: (\d+) records could not be read", err).group(1))
    assert stored + lost == 2000 and 0 < lost <= 40  # 8 KiB spoil about a page, not what follows
    accepted, duplicates = map(int, re.search(r"\((\d+) accepted, (\d+) duplicates\)", out).groups())
    assert (accepted, duplicates) == (stored, 0)  # each once
    (kept,) = spool_dir.glob(f"{run_id}.sqlite.corrupt-*")
    assert f"the damaged file is kept as {kept}" in err and "were not sent" in err
    assert not path.exists()  # what was read of it is delivered
    code, out, err = run_sync(capsys, spool_dir, "--server", server)
    assert code == 2 and "every run here has been sent" not in out
    assert f"{kept}: a damaged spool set aside" in err
    assert get(server, f"/api/v1/runs/{run_id}")["records"] == stored


def test_syncing_set_aside_records_of_a_finished_run_leaves_it_finished(server, tmp_path, capsys):
    records = agent_run(tmp_path / "spool", "sync-stays-finished", None, steps=4)
    spool = tmp_path / "spool" / "sync-stays-finished.sqlite"
    with sqlite3.connect(spool) as db:  # interval 2 as a server refuses it: negative tokens
        ((row_id, body),) = db.execute("SELECT id, body FROM records WHERE body LIKE '%\"interval\":2,%'")
        db.execute("UPDATE records SET body = ? WHERE id = ?", (json.dumps({**json.loads(body), "tokens": -1}), row_id))
    db.close()
    assert run_sync(capsys, spool, "--server", server)[0] == 2  # interval 2 set aside, the run finished
    assert get(server, "/api/v1/runs/sync-stays-finished")["status"] == "finished"
    with sqlite3.connect(spool) as db:  # the server would take it now (as one that was upgraded would)
        db.execute("UPDATE set_aside SET body = ?", (body,))
    db.close()
    code, out, err = run_sync(capsys, spool, "--server", server)
    assert code == 0 and "1 set aside before now taken" in out, err
    assert_stored(server, "sync-stays-finished", records, status="finished")


def test_off_a_terminal_the_output_is_plain_lines_and_links_only_runs_the_server_took(server, tmp_path):
    """Piped to a file (the issue's log), sync writes whole lines, no carriage-return bar, and
    links only the runs the server took something of: not one whose every record it refused."""
    delivered = agent_run(tmp_path / "spool", "sync-piped", None, steps=40)
    refused = agent_run(tmp_path / "spool", "sync-all-refused", None, steps=2)
    spool = tmp_path / "spool" / "sync-all-refused.sqlite"
    with sqlite3.connect(spool) as db:  # every record of this run as a server refuses it
        for row_id, body in db.execute("SELECT id, body FROM records").fetchall():
            db.execute(
                "UPDATE records SET body = ? WHERE id = ?", (json.dumps({**json.loads(body), "tokens": -1}), row_id)
            )
        db.execute("DELETE FROM meta WHERE key = 'final'")
    db.close()
    with (tmp_path / "out.log").open("w") as out, (tmp_path / "err.log").open("w") as err:
        command = [*SYNC[:-2], str(tmp_path / "spool"), "--server", server, "--batch", "5"]
        code = subprocess.run(command, stdout=out, stderr=err, env=clean_env(), timeout=120).returncode
    out, err = ((tmp_path / name).read_bytes().decode() for name in ("out.log", "err.log"))  # "\r" kept
    assert code == 2, err  # the refused records are set aside
    assert "\r" not in out + err
    assert f"run sync-piped: {server}/runs/sync-piped" in out
    assert f"{server}/runs/sync-all-refused" not in out and "run sync-all-refused: 0 records sent" in out
    assert_stored(server, "sync-piped", delivered)
    assert get(server, "/api/v1/runs/sync-all-refused")["records"] == 0 and len(refused) == 2
