"""The sender against a real HTTP server on 127.0.0.1 whose answers each test scripts: delivery,
outages, refused and poisoned records, tokens, Retry-After, damaged and full spools, unexpected
errors, a full queue, and kill -9 of the sending process."""

from __future__ import annotations

import gzip
import itertools
import json
import logging
import random
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

import packscope.agent.sender as sender_module
from packscope.agent.config import AgentConfig
from packscope.agent.sender import Sender, spool_path

AGENT_DIR = Path(sender_module.__file__).parent
RUN_ID = "run-under-test"

# A script sees each intervals batch and may answer it itself: (status, body, headers), or None
# to let the server store it.
Script = Callable[[list[dict]], "tuple[int, dict, dict] | None"]


class Server:
    """What the real backend does for the sender, on a port of its own: registers runs, stores
    interval records once per (rank, interval), counts duplicates, and takes the final PATCH."""

    def __init__(self) -> None:
        self.stored: dict[tuple[int, int], dict] = {}
        self.order: list[int] = []  # intervals in the order they were stored
        self.duplicates = 0
        self.batches: list[tuple[float, int, list[int]]] = []  # (time, status, intervals) per request
        self.patches: list[dict] = []
        self.token: str | None = None
        self.script: Script | None = None
        self.delay_s = 0.0
        self.patch_status = 200  # the answer to the final PATCH
        self.lock = threading.Lock()
        self.port = 0
        self._http: ThreadingHTTPServer | None = None
        self.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # keep the test output clean
                pass

            def _answer(self, status: int, body: dict, headers: dict | None = None) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, str(v))
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _body(self) -> dict:
                data = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    data = gzip.decompress(data)
                return json.loads(data)

            def _authorized(self) -> bool:
                if server.token is None or self.headers.get("Authorization") == f"Bearer {server.token}":
                    return True
                self._answer(401, {"detail": "missing or wrong bearer token"})
                return False

            def do_POST(self):
                try:
                    body = self._body()
                except ValueError as exc:  # as FastAPI does with a body that is not JSON
                    return self._answer(422, {"detail": f"JSON decode error: {exc}"})
                if not self._authorized():
                    return
                if self.path == "/api/v1/runs":
                    return self._answer(201, {"run_id": body["run_id"]})
                time.sleep(server.delay_s)
                records = body["intervals"]
                keys = [r["interval"] for r in records]
                scripted = server.script(records) if server.script else None
                if scripted is not None:
                    with server.lock:
                        server.batches.append((time.monotonic(), scripted[0], keys))
                    return self._answer(*scripted)
                accepted = 0
                with server.lock:
                    for r in records:
                        key = (r["rank"], r["interval"])
                        if key in server.stored:
                            server.duplicates += 1
                        else:
                            server.stored[key] = r
                            server.order.append(r["interval"])
                            accepted += 1
                    server.batches.append((time.monotonic(), 200, keys))
                self._answer(200, {"accepted": accepted, "duplicates": len(records) - accepted})

            def do_PATCH(self):
                body = self._body()
                if self._authorized():
                    if server.patch_status != 200:
                        return self._answer(server.patch_status, {"detail": "cannot set the status now"})
                    server.patches.append(body)
                    self._answer(200, {})

        self._http = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._http.daemon_threads = True
        self.port = self._http.server_address[1]
        threading.Thread(target=self._http.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()

    def stop(self) -> None:
        """Down: nothing listens on the port any more (connections are refused)."""
        if self._http is not None:
            self._http.shutdown()
            self._http.server_close()
            self._http = None

    def answered(self, status: int) -> list[tuple[float, int, list[int]]]:
        with self.lock:
            return [b for b in self.batches if b[1] == status]


@pytest.fixture
def server():
    s = Server()
    yield s
    s.stop()


def make_config(server: Server | str, tmp_path: Path, **overrides) -> AgentConfig:
    """Fast retries so that the tests stay short; everything else as the agent would set it."""
    settings = dict(
        server=server.url if isinstance(server, Server) else server,
        spool_dir=str(tmp_path / "spool"),
        retry_s=0.02,
        retry_max_s=0.2,
        request_timeout_s=2.0,
    )
    return AgentConfig(**{**settings, **overrides})


def make_sender(server: Server | str, tmp_path: Path, run_id: str = RUN_ID, **overrides) -> Sender:
    return Sender(make_config(server, tmp_path, **overrides), run_id, {"run_id": run_id, "name": "t"})


def rec(i: int) -> dict:
    return {"rank": 0, "interval": i, "first_step": i * 10 + 1, "last_step": i * 10 + 10, "tokens": 4096 * i}


def wait_until(condition: Callable[[], bool], timeout_s: float = 5.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what or condition}"
        time.sleep(0.005)


def spooled_intervals(path: Path) -> list[int]:
    db = sqlite3.connect(path)
    try:
        return [json.loads(b)["interval"] for (b,) in db.execute("SELECT body FROM records ORDER BY id")]
    finally:
        db.close()


def errors(caplog: pytest.LogCaptureFixture, text: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR and text in r.getMessage()]


# -- delivery -------------------------------------------------------------------------------------
def test_records_reach_the_server_in_order_and_the_spool_is_removed(server, tmp_path):
    sender = make_sender(server, tmp_path, batch_size=8)
    assert sender.spool.path == tmp_path / "spool" / f"{RUN_ID}.sqlite"
    for i in range(50):
        sender.submit(rec(i))
    assert sender.close({"status": "finished"}, timeout_s=10) is True
    assert server.order == list(range(50)) and server.duplicates == 0
    assert all(len(keys) <= 8 for _, _, keys in server.batches)
    assert server.patches == [{"status": "finished"}]
    stats = sender.stats()
    assert stats["sent"] == stats["kept"] == 50 and stats["spooled"] == 0
    assert not any(stats[k] for k in ("evicted", "rejected", "poisoned", "lost", "dropped", "duplicates"))
    assert not list((tmp_path / "spool").iterdir())  # nothing left behind


def test_fields_the_server_does_not_know_are_warned_about_once(server, tmp_path, caplog):
    """The server names the record fields it ignored; the sender says so once per run, per field."""
    server.script = lambda records: (200, {"accepted": len(records), "duplicates": 0, "ignored": ["gpu.temp_c"]}, {})
    sender = make_sender(server, tmp_path, batch_size=2)
    with caplog.at_level(logging.WARNING, logger="packscope.agent"):
        for i in range(6):
            sender.submit(rec(i))
        assert sender.close({"status": "finished"}, timeout_s=10) is True
    warned = [r.getMessage() for r in caplog.records if "does not know the record field" in r.getMessage()]
    assert len(server.batches) >= 3 and len(warned) == 1 and "gpu.temp_c" in warned[0]


def test_the_spool_lives_under_the_home_cache_by_default_one_file_per_run(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    config = AgentConfig(server="http://127.0.0.1:9")
    assert spool_path(config, "sft-1") == tmp_path / ".cache/packscope/spool/sft-1.sqlite"
    odd = spool_path(config, "a/b c")
    assert odd.parent == tmp_path / ".cache/packscope/spool" and odd.name.startswith("a_b_c-")
    assert spool_path(config, "a/b c") != spool_path(config, "a_b_c")


def test_an_outage_keeps_records_on_disk_and_a_later_process_replays_them_first(server, tmp_path):
    server.stop()
    first = make_sender(server, tmp_path, request_timeout_s=0.5)
    for i in range(5):
        first.submit(rec(i))
    wait_until(lambda: first.stats()["kept"] == 5, what="the records to be spooled")
    wait_until(lambda: first.last_error is not None, what="a failed request")
    assert first.close({"status": "failed"}, timeout_s=0.3) is False
    assert spooled_intervals(first.spool.path) == [0, 1, 2, 3, 4]  # still on disk, in order
    assert first.stats()["spooled"] == 5

    server.start()  # same port
    second = make_sender(server, tmp_path)
    for i in range(5, 8):
        second.submit(rec(i))
    assert second.close({"status": "finished"}, timeout_s=10) is True
    assert server.order == list(range(8))  # the killed run's records first
    assert not first.spool.path.exists()


def test_close_keeps_trying_until_its_timeout(server, tmp_path):
    server.stop()
    sender = make_sender(server, tmp_path, retry_s=0.05, retry_max_s=0.1, request_timeout_s=0.5)
    sender.submit(rec(0))
    wait_until(lambda: sender.stats()["kept"] == 1)
    threading.Timer(0.5, server.start).start()  # the server comes back while close() waits
    t0 = time.monotonic()
    assert sender.close({"status": "finished"}, timeout_s=5) is True
    assert 0.4 < time.monotonic() - t0 < 3
    assert server.order == [0]


@pytest.mark.alone  # the submits are timed against the wall clock
def test_a_slow_server_never_blocks_submit(server, tmp_path):
    server.delay_s = 0.5
    sender = make_sender(server, tmp_path)
    t0 = time.perf_counter()
    for i in range(100):
        sender.submit(rec(i))
    assert time.perf_counter() - t0 < 0.1  # 100 records handed over while one request takes 0.5 s
    assert sender.close(None, timeout_s=10) is True
    assert server.order == list(range(100))


def test_a_full_queue_drops_and_counts_and_close_says_so(server, tmp_path, caplog):
    server.delay_s = 0.3
    sender = make_sender(server, tmp_path, queue_size=4)
    for i in range(100):
        sender.submit(rec(i))
    dropped = sender.stats()["dropped"]
    assert dropped > 0 and any("queue full" in r.getMessage() for r in caplog.records)
    assert sender.close(None, timeout_s=10) is False
    assert len(server.stored) == 100 - dropped
    sender.submit(rec(100))  # after close: counted, not silently ignored
    assert sender.stats()["dropped"] == dropped + 1


def test_a_lost_run_is_registered_again(server, tmp_path):
    answered = []

    def forget_the_run_once(records):  # e.g. the server restarted on a fresh database
        if not answered:
            answered.append(404)
            return 404, {"detail": "run not found"}, {}
        return None

    server.script = forget_the_run_once
    sender = make_sender(server, tmp_path)
    sender.submit(rec(0))
    assert sender.close(None, timeout_s=10) is True
    assert server.order == [0]


def test_a_long_outage_evicts_the_oldest_records_counts_and_logs_them(server, tmp_path, caplog):
    caplog.set_level(logging.WARNING, logger="packscope.agent")
    server.stop()
    one = len(json.dumps(rec(10), separators=(",", ":")))
    sender = make_sender(server, tmp_path, spool_max_bytes=5 * one)
    for i in range(10, 25):  # two-digit intervals: every record is `one` bytes
        sender.submit(rec(i))
    wait_until(lambda: sender.stats()["kept"] == 15)
    assert sender.close(None, timeout_s=0.3) is False
    stats = sender.stats()
    assert stats["evicted"] == 10 and stats["spooled"] == 5  # every record is either kept or counted
    assert spooled_intervals(sender.spool.path) == list(range(20, 25))  # the newest, in order
    messages = [r.getMessage() for r in caplog.records]
    assert any("evicted the 10 oldest interval records (10 in total)" in m for m in messages)
    assert "evicted 10" in messages[-1]  # and again in the summary close() logs


# -- records the server will not take -------------------------------------------------------------
def submit_all_then_start(server: Server, tmp_path: Path, n: int, **overrides) -> Sender:
    """Spool n records while the server is down, so that they go out in full batches."""
    server.stop()
    sender = make_sender(server, tmp_path, **overrides)
    for i in range(n):
        sender.submit(rec(i))
    wait_until(lambda: sender.stats()["kept"] == n)
    server.start()
    return sender


def test_a_refused_record_is_set_aside_with_the_servers_message_and_the_rest_delivered(server, tmp_path, caplog):
    server.script = lambda records: (
        (422, {"detail": "interval 2: tokens must be >= 0"}, {}) if any(r["interval"] == 2 for r in records) else None
    )
    sender = submit_all_then_start(server, tmp_path, 12, batch_size=8)
    assert sender.close({"status": "finished"}, timeout_s=10) is False  # one record did not make it
    assert sorted(server.order) == [i for i in range(12) if i != 2]
    stats = sender.stats()
    assert stats["rejected"] == 1 and stats["poisoned"] == 0 and stats["spooled"] == 0
    ((kind, reason, record),) = sender.spool.set_aside_records()
    assert kind == "rejected" and "422" in reason and "tokens must be >= 0" in reason and record == rec(2)
    assert errors(caplog, "refused interval 2")
    assert server.patches == [{"status": "finished"}]  # the run's status is still set


def test_a_batch_too_large_for_the_server_is_split_not_set_aside(server, tmp_path):
    server.script = lambda records: (413, {"detail": "body too large"}, {}) if len(records) > 3 else None
    sender = submit_all_then_start(server, tmp_path, 20, batch_size=16)
    assert sender.close(None, timeout_s=10) is True
    assert server.order == list(range(20)) and sender.stats()["rejected"] == 0


def test_a_poisoned_record_is_isolated_set_aside_and_everything_after_it_delivered(server, tmp_path, caplog):
    server.script = lambda records: (
        (500, {"detail": "internal error"}, {}) if any(r["interval"] == 5 for r in records) else None
    )
    sender = submit_all_then_start(server, tmp_path, 20, batch_size=8, max_attempts=3)
    wait_until(lambda: sender.stats()["poisoned"] == 1, what="the record to be set aside")
    for i in range(20, 25):  # later records are not held up
        sender.submit(rec(i))
    assert sender.close(None, timeout_s=10) is False
    assert sorted(server.order) == [i for i in range(25) if i != 5]
    assert sender.stats()["poisoned"] == 1 and sender.stats()["spooled"] == 0
    ((kind, reason, record),) = sender.spool.set_aside_records()
    assert kind == "poisoned" and "500" in reason and record == rec(5)
    assert errors(caplog, "keeps failing on interval 5")
    # Bounded: 3 tries of each batch holding record 5 as it is halved 8 -> 4 -> 2 -> 1, plus the last try.
    failures = server.answered(500)
    assert 3 * 4 <= len(failures) <= 3 * 4 + 1, failures
    assert [len(keys) for _, _, keys in failures[::3]] == [8, 4, 2, 1, 1][: len(failures[::3])]


def test_a_server_failing_every_request_sets_nothing_aside(server, tmp_path):
    failing = threading.Event()
    failing.set()
    server.script = lambda records: (500, {"detail": "database unavailable"}, {}) if failing.is_set() else None
    sender = submit_all_then_start(server, tmp_path, 20, batch_size=8, max_attempts=2)
    wait_until(lambda: len(server.answered(500)) >= 20, what="many failed requests")
    failing.clear()
    assert sender.close(None, timeout_s=10) is True
    assert sorted(server.order) == list(range(20))  # a probe may overtake its suspect
    assert sender.stats()["poisoned"] == 0 and sender.stats()["rejected"] == 0


def test_a_failing_last_record_stays_spooled_while_nothing_can_show_it_is_the_record(server, tmp_path):
    server.script = lambda records: (500, {"detail": "boom"}, {})
    sender = make_sender(server, tmp_path, max_attempts=2)
    sender.submit(rec(0))
    wait_until(lambda: len(server.answered(500)) >= 4)
    assert sender.close(None, timeout_s=0.3) is False
    assert sender.stats()["poisoned"] == 0 and spooled_intervals(sender.spool.path) == [0]


def test_a_refused_token_keeps_records_until_an_agent_with_the_right_token_replays_them(server, tmp_path, caplog):
    server.token = "right"
    wrong = make_sender(server, tmp_path, token="wrong")
    for i in range(6):
        wrong.submit(rec(i))
    wait_until(lambda: wrong.stats()["kept"] == 6)
    assert wrong.close({"status": "finished"}, timeout_s=0.5) is False
    assert server.stored == {} and spooled_intervals(wrong.spool.path) == list(range(6))
    assert wrong.stats()["rejected"] == 0 and not wrong.spool.set_aside_records()
    assert errors(caplog, "refuses our token")

    right = make_sender(server, tmp_path, token="right")
    assert right.close({"status": "finished"}, timeout_s=10) is True
    assert server.order == list(range(6))


@pytest.mark.alone  # the submits are timed against the wall clock
@pytest.mark.parametrize("status", [429, 503])
def test_retry_after_is_honoured_while_records_stay_spooled(server, tmp_path, status):
    answered = []

    def busy_once(records):
        if not answered:
            answered.append(time.monotonic())
            return status, {"detail": "slow down"}, {"Retry-After": "1"}
        return None

    server.script = busy_once
    sender = make_sender(server, tmp_path)
    sender.submit(rec(0))
    wait_until(lambda: answered, what="the first answer")
    t0 = time.perf_counter()
    for i in range(1, 5):
        sender.submit(rec(i))  # never blocked by the wait
    assert time.perf_counter() - t0 < 0.05
    wait_until(lambda: sender.stats()["kept"] == 5)
    time.sleep(0.5)
    assert sender.stats()["spooled"] == 5 and server.stored == {}  # still waiting, on disk
    wait_until(lambda: len(server.stored) == 5, 5, "the retry")
    first_retry = min(t for t, s, _ in server.batches if s == 200)
    assert first_retry - answered[0] >= 0.95
    assert sender.close(None, timeout_s=5) is True


def test_close_does_not_outwait_its_timeout_for_a_long_retry_after(server, tmp_path):
    server.script = lambda records: (429, {"detail": "later"}, {"Retry-After": "30"})
    sender = make_sender(server, tmp_path)
    sender.submit(rec(0))
    wait_until(lambda: server.batches)
    t0 = time.monotonic()
    assert sender.close(None, timeout_s=1) is False
    assert time.monotonic() - t0 < 1.6
    assert len(server.batches) == 1  # no retry before the server's time
    assert spooled_intervals(sender.spool.path) == [0]


# -- the spool's own troubles ---------------------------------------------------------------------
def test_a_damaged_spool_file_is_moved_aside_and_the_sender_goes_on(server, tmp_path, caplog):
    path = tmp_path / "spool" / f"{RUN_ID}.sqlite"
    path.parent.mkdir()
    path.write_bytes(b"\x00garbage where a spool should be" * 200)
    sender = make_sender(server, tmp_path)
    for i in range(3):
        sender.submit(rec(i))
    wait_until(lambda: len(server.stored) == 3)
    assert sender._thread.is_alive()
    assert sender.close(None, timeout_s=10) is False  # whatever the damaged file held was not replayed
    assert sender.spool.quarantined is not None and sender.spool.quarantined.exists()
    assert errors(caplog, "is damaged")


def test_a_damaged_row_in_the_spool_is_refused_by_the_server_and_set_aside(server, tmp_path):
    server.stop()
    first = make_sender(server, tmp_path, request_timeout_s=0.5)
    for i in range(6):
        first.submit(rec(i))
    wait_until(lambda: first.stats()["kept"] == 6)
    assert first.close(None, timeout_s=0.1) is False
    db = sqlite3.connect(first.spool.path)  # one row's text damaged on the disk: no longer JSON
    with db:
        db.execute("""UPDATE records SET body = replace(body, '"interval":3,', '"interval":3 ')""")
    db.close()

    server.start()
    second = make_sender(server, tmp_path, batch_size=8)
    assert second.close(None, timeout_s=10) is False
    assert sorted(server.order) == [0, 1, 2, 4, 5]
    ((kind, reason, record),) = second.spool.set_aside_records()
    assert kind == "rejected" and "422" in reason and isinstance(record, str) and '"interval":3 ' in record
    assert second.stats()["rejected"] == 1 and second.stats()["spooled"] == 0


def test_an_unexpected_error_in_the_thread_is_logged_and_the_thread_goes_on(server, tmp_path, monkeypatch, caplog):
    real_urlopen = urllib.request.urlopen
    calls = []

    def urlopen_failing_three_times(*args, **kwargs):
        calls.append(1)
        if len(calls) <= 3:
            raise RuntimeError("not a network error: something nobody expected")
        return real_urlopen(*args, **kwargs)

    monkeypatch.setattr(urllib.request, "urlopen", urlopen_failing_three_times)
    sender = make_sender(server, tmp_path)
    for i in range(4):
        sender.submit(rec(i))
    assert sender.close(None, timeout_s=10) is True
    assert server.order == [0, 1, 2, 3]
    assert errors(caplog, "unexpected error")


def test_an_unusable_spool_directory_sends_directly_and_counts_what_it_could_not(server, tmp_path, caplog):
    (tmp_path / "not-a-dir").write_text("")
    sender = make_sender(server, tmp_path, spool_dir=str(tmp_path / "not-a-dir" / "spool"))
    for i in range(3):
        sender.submit(rec(i))
    wait_until(lambda: len(server.stored) == 3)
    assert sender.stats()["kept"] == 0 and sender.stats()["lost"] == 0
    server.stop()
    sender.submit(rec(3))
    wait_until(lambda: sender.stats()["lost"] == 1)
    assert sender.stats()["kept"] == 0
    assert sender.close(None, timeout_s=0.5) is False
    assert errors(caplog, "could not write") and errors(caplog, "1 interval records lost")


# The sending process of the next tests. It loads the agent's config, spool and sender modules
# without the package's __init__, which imports torch: they need the standard library only.
CHILD = r"""
import json, resource, signal, sys, time, types
agent_dir, url, spool_dir, run_id, base, mode = sys.argv[1:7]
package = types.ModuleType("packscope.agent")
package.__path__ = [agent_dir]
sys.modules["packscope.agent"] = package
from packscope.agent.config import AgentConfig
from packscope.agent.sender import Sender

config = AgentConfig(server=url, spool_dir=spool_dir, retry_s=0.01, retry_max_s=0.05, request_timeout_s=1.0,
                     batch_size=16, queue_size=100_000)
sender = Sender(config, run_id, {"run_id": run_id})
base = int(base)
if mode == "run":  # submit until killed; print the number of records kept (committed) so far
    i, reported = 0, -1
    while True:
        sender.submit({"rank": 0, "interval": base + i, "pad": "r" * 200})
        i += 1
        kept = sender.stats()["kept"]
        if kept != reported:
            print(kept, flush=True)
            reported = kept
        time.sleep(0.001)
elif mode == "finish":
    for i in range(20):
        sender.submit({"rank": 0, "interval": base + i, "pad": "f" * 200})
    print(json.dumps({"closed": sender.close(None, timeout_s=20), **sender.stats()}), flush=True)
elif mode == "disk-full":  # the spool's file may not grow past a few pages: writes fail with EFBIG
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    limit = 320 * 1024
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    for i in range(400):
        sender.submit({"rank": 0, "interval": base + i, "pad": "d" * 1000})
        time.sleep(0.0005)
    print(json.dumps({"closed": sender.close(None, timeout_s=0.5), **sender.stats()}), flush=True)
"""


def child(server: Server, tmp_path: Path, base: int, mode: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(AGENT_DIR), server.url, str(tmp_path / "spool"), RUN_ID, str(base), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_full_disk_counts_records_lost_never_kept(server, tmp_path):
    server.stop()
    proc = child(server, tmp_path, 0, "disk-full")
    out, err = proc.communicate(timeout=30)
    assert proc.returncode == 0, err
    stats = json.loads(out)
    assert stats["lost"] > 0 and stats["kept"] > 0  # some fitted before the file hit its limit
    assert stats["kept"] + stats["lost"] == 400 and stats["dropped"] == 0
    assert stats["closed"] is False
    left = spooled_intervals(tmp_path / "spool" / f"{RUN_ID}.sqlite")  # what was kept is all there
    assert len(left) == stats["kept"] and left == sorted(set(left))
    assert "interval records lost" in err


def test_kill_9_at_random_points_every_durable_record_is_stored_exactly_once(server, tmp_path):
    rng = random.Random()
    seed = rng.randrange(10**6)
    rng.seed(seed)
    flapping = threading.Event()

    def flap() -> None:  # the server goes down and comes back now and then
        while not flapping.is_set():
            time.sleep(rng.uniform(0.05, 0.2))
            server.stop()
            time.sleep(rng.uniform(0.02, 0.15))
            server.start()

    flapper = threading.Thread(target=flap, daemon=True)
    flapper.start()
    durable: list[int] = []
    submitted_ranges = []
    kills = 5
    try:
        for round_ in range(kills):
            base = round_ * 1_000_000
            proc = child(server, tmp_path, base, "run")
            assert proc.stdout is not None
            reports = [int(proc.stdout.readline())]
            deadline = time.monotonic() + rng.uniform(0.1, 0.5)
            while time.monotonic() < deadline:
                reports.append(int(proc.stdout.readline()))
            proc.send_signal(signal.SIGKILL)
            rest, _ = proc.communicate()
            reports += [int(x) for x in rest.split()]
            durable += range(base, base + reports[-1])
            submitted_ranges.append(base)
    finally:
        flapping.set()
        flapper.join()
    if server._http is None:
        server.start()

    # Between processes, the spool on disk holds each record once.
    left = spooled_intervals(tmp_path / "spool" / f"{RUN_ID}.sqlite")
    assert len(left) == len(set(left)), f"seed {seed}"

    proc = child(server, tmp_path, 9_000_000, "finish")
    out, err = proc.communicate(timeout=30)
    final = json.loads(out)
    assert final["closed"] is True, (final, err, f"seed {seed}")

    stored = {interval for _, interval in server.stored}
    assert len(durable) > 200
    missing = [i for i in durable if i not in stored]
    assert not missing, f"seed {seed}: {len(missing)} durable records never stored, e.g. {missing[:5]}"
    assert set(range(9_000_000, 9_000_020)) <= stored
    assert all(any(b <= i < b + 1_000_000 for b in [*submitted_ranges, 9_000_000]) for i in stored)
    assert len(server.order) == len(set(server.order)) == len(stored)  # stored exactly once each
    # Re-sends happen only around a kill: at most the batch in flight when each process died.
    assert server.duplicates <= kills * 16, f"seed {seed}"
    assert not (tmp_path / "spool" / f"{RUN_ID}.sqlite").exists()


# -- a server that asks for no wait, set-aside records tried again, offline runs -----------------
def test_retry_after_zero_never_brings_the_retries_under_the_backoff(server, tmp_path):
    # Before, Retry-After: 0 replaced the backoff: 7,799 requests in 20 s from one sender.
    server.script = lambda records: (429, {"detail": "busy"}, {"Retry-After": "0"})
    sender = make_sender(server, tmp_path, retry_s=0.4, retry_max_s=60)
    sender.submit(rec(0))
    time.sleep(3.0)
    times = [t for t, _, _ in server.answered(429)]
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert 2 <= len(times) <= 4, times  # 0, 0.4, 1.2, 2.8 s: the backoff's doubling waits
    assert all(gap >= 0.4 * 2**i - 0.02 for i, gap in enumerate(gaps)), gaps  # never sooner
    server.script = None
    assert sender.close(None, timeout_s=5) is True  # close makes its last try at once
    assert server.order == [0]


def test_a_set_aside_record_is_tried_again_and_delivered_once_the_server_takes_it(server, tmp_path):
    refusing = threading.Event()
    refusing.set()

    def refuse_2(records):
        return (422, {"detail": "tokens too large"}, {}) if refusing.is_set() and rec(2) in records else None

    server.script = refuse_2
    sender = submit_all_then_start(server, tmp_path, 6, batch_size=8, set_aside_retry_s=0.3)
    wait_until(lambda: sender.stats()["rejected"] == 1 and len(server.stored) == 5, what="the others delivered")
    assert sorted(server.order) == [0, 1, 3, 4, 5]
    refusing.clear()  # e.g. the server was upgraded to take it
    wait_until(lambda: 2 in server.order, 10, "the set-aside record to be retried")
    # The server has it before the sender has read the answer: wait for the sender's books too.
    recovered = lambda: sender.stats()["recovered"] == 1 and not sender.spool.set_aside_records()  # noqa: E731
    wait_until(recovered, 10, "the retry to be counted as recovered and leave the set-aside records")
    assert sender.close({"status": "finished"}, timeout_s=5) is True  # nothing is missing any more
    assert sorted(server.order) == list(range(6)) and server.duplicates == 0


def test_set_aside_retries_stop_at_the_attempt_cap_and_the_record_stays(server, tmp_path):
    server.script = lambda records: (422, {"detail": "never"}, {}) if any(r["interval"] == 1 for r in records) else None
    sender = submit_all_then_start(server, tmp_path, 3, batch_size=8, set_aside_retry_s=0.05, set_aside_max_attempts=3)
    wait_until(lambda: len([k for _, s, k in server.batches if s == 422 and k == [1]]) >= 3, 10, "three tries")
    time.sleep(1.0)  # past the cap: 0.05 s, 0.1 s, 0.2 s... waits would have tried again by now
    alone = [k for _, s, k in server.batches if s == 422 and k == [1]]
    assert len(alone) == 3  # the try that set it aside, then two retries
    assert sender.close(None, timeout_s=5) is False
    ((kind, reason, record),) = sender.spool.set_aside_records()
    assert kind == "rejected" and "never" in reason and record == rec(1)


def test_offline_the_spool_keeps_records_registration_and_status_and_sends_nothing(tmp_path):
    config = AgentConfig(server=None, spool_dir=str(tmp_path / "runs"))
    sender = Sender(config, RUN_ID, {"run_id": RUN_ID, "name": "offline"})
    for i in range(5):
        sender.submit(rec(i))
    assert sender.close({"status": "finished"}, timeout_s=5) is True  # everything is where it belongs
    assert sender.stats()["kept"] == 5 and sender.stats()["sent"] == 0
    path = tmp_path / "runs" / f"{RUN_ID}.sqlite"
    assert spooled_intervals(path) == list(range(5))
    db = sqlite3.connect(path)
    meta = dict(db.execute("SELECT key, value FROM meta"))
    db.close()
    assert json.loads(meta["run"]) == {"run_id": RUN_ID, "name": "offline"}
    assert json.loads(meta["final"]) == {"status": "finished"}


def test_offline_with_records_kept_the_thread_sleeps_instead_of_spinning(tmp_path, monkeypatch):
    # Before, offline with a non-empty spool, every pass found a "retry due" and looped at once:
    # the thread held the GIL between the trainer's ops (HF steps went from 0.03 s to 0.1-6 s).
    passes = []
    original = Sender._wait_for_records
    monkeypatch.setattr(Sender, "_wait_for_records", lambda self: (passes.append(1), original(self))[1])
    config = AgentConfig(server=None, spool_dir=str(tmp_path / "runs"))
    sender = Sender(config, RUN_ID, {"run_id": RUN_ID, "name": "offline"})
    sender.submit(rec(0))
    wait_until(lambda: len(sender.spool) == 1, what="the record to be kept")
    before = len(passes)
    time.sleep(1.5)
    assert len(passes) - before <= 3, f"{len(passes) - before} passes in 1.5 s"  # one a second when idle
    assert sender.close({"status": "finished"}, timeout_s=5) is True


def test_a_final_status_the_server_would_not_take_is_kept_for_later(server, tmp_path):
    server.patch_status = 503
    sender = make_sender(server, tmp_path)
    sender.submit(rec(0))
    assert sender.close({"status": "finished"}, timeout_s=5) is False
    assert server.order == [0] and server.patches == []
    db = sqlite3.connect(sender.spool.path)  # all records delivered, but the file stays for the status
    assert json.loads(db.execute("SELECT value FROM meta WHERE key = 'final'").fetchone()[0]) == {"status": "finished"}
    db.close()
    server.patch_status = 200
    again = make_sender(server, tmp_path)  # a resumed run sets its own status and clears the old one
    assert again.close({"status": "failed"}, timeout_s=5) is True
    assert server.patches == [{"status": "failed"}] and not sender.spool.path.exists()
