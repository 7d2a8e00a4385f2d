"""`packscope import`: run files written by a real (CPU) training, sent to a real server; the
server's totals are the brute-force sums of the file's records, a second import stores nothing,
bad files are named by line and send nothing, tokens and conflicts are told apart."""

from __future__ import annotations

import gzip
import http.server
import json
import sqlite3
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import ClassVar

import pytest

from cli.support import STEPS, derived, free_port, get, get_status, running_server
from packscope.commands import importer
from packscope.commands.cli import main
from packscope.commands.importer import MAX_BATCH
from packscope.core.http_client import Backoff
from packscope.core.run_file import read_run_file

SUMS = ("tokens", "real_tokens", "documents", "packs", "steps", "gpu_time_s", "flops_bshd", "flops_thd", "flops_useful")


@pytest.fixture(autouse=True)
def _no_token_from_the_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(importer.TOKEN_ENV, raising=False)


def run_import(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main(["import", *map(str, argv)])
    out, err = capsys.readouterr()
    return code, out, err


def brute_sums(*paths: Path) -> dict[str, float]:
    records = [r for p in paths for r in read_run_file(p).records]
    sums = {key: sum(r[key] for r in records) for key in SUMS}
    sums["steps"] = sum(r["steps"] for r in records if r["rank"] == 0)  # each step once, not once per rank
    return sums


def assert_totals_match(summary: dict, expected: dict[str, float]) -> None:
    totals = summary["totals"]
    for key in ("tokens", "real_tokens", "documents", "packs", "steps"):
        assert totals[key] == expected[key], key
    for key in ("gpu_time_s", "flops_bshd", "flops_thd", "flops_useful"):
        assert totals[key] == pytest.approx(expected[key], rel=1e-9), key


def stored_runs(server: str) -> set[str]:
    return {r["run_id"] for r in get(server, "/api/v1/runs?limit=200")["runs"]}


def test_the_run_file_is_a_real_training(trained):
    thd = read_run_file(trained["thd"])
    assert [r["interval"] for r in thd.records] == list(range(STEPS))
    assert thd.run["layout"] == "thd" and read_run_file(trained["bshd"]).run["layout"] == "bshd"
    assert brute_sums(trained["thd"])["real_tokens"] == brute_sums(trained["bshd"])["real_tokens"]  # same documents


def test_the_server_totals_are_the_sums_of_the_file(trained, server, tmp_path, capsys):
    path = derived(trained["thd"], tmp_path / "rank0.jsonl", "import-sums")
    code, out, err = run_import(capsys, path, "--server", server, "--batch", "5")
    assert code == 0, err
    assert f"{path}: run import-sums: {STEPS} records, {STEPS} accepted, 0 duplicates" in out
    assert f"run import-sums: finished  {server}/runs/import-sums" in out
    assert "5/12 records sent" in err and "12/12 records sent" in err  # progress, one line a batch
    summary = get(server, "/api/v1/runs/import-sums")
    assert summary["records"] == STEPS and summary["status"] == "finished"
    assert_totals_match(summary, brute_sums(path))
    last_end = max(r["wall_end"] for r in read_run_file(path).records)
    assert datetime.fromisoformat(summary["ended_at"].replace("Z", "+00:00")) == datetime.fromtimestamp(last_end, UTC)


def test_importing_twice_stores_nothing_twice(trained, server, tmp_path, capsys):
    path = derived(trained["bshd"], tmp_path / "rank0.jsonl", "import-twice")
    assert run_import(capsys, path, "--server", server)[0] == 0
    before = get(server, "/api/v1/runs/import-twice")
    code, out, err = run_import(capsys, path, "--server", server, "--batch", "7")
    assert code == 0, err
    assert f"{STEPS} records, 0 accepted, {STEPS} duplicates, run already on the server" in out
    after = get(server, "/api/v1/runs/import-twice")
    assert after["records"] == before["records"] == STEPS
    assert after["totals"] == before["totals"]
    assert_totals_match(after, brute_sums(path))


def test_the_ranks_of_one_run_are_summed(trained, server, tmp_path, capsys):
    rank0 = derived(trained["thd"], tmp_path / "rank0.jsonl", "import-ranks")
    # Rank 1 as a copy of rank 0's records under rank 1: the server sums ranks per interval.
    rank1 = derived(
        trained["thd"], tmp_path / "rank1.jsonl", "import-ranks", records=lambda rs: [{**r, "rank": 1} for r in rs]
    )
    code, out, err = run_import(capsys, rank0, rank1, "--server", server)
    assert code == 0, err
    assert out.count("run import-ranks: finished") == 1  # one status, after both files
    summary = get(server, "/api/v1/runs/import-ranks")
    assert summary["records"] == 2 * STEPS
    assert_totals_match(summary, brute_sums(rank0, rank1))


def test_a_file_that_is_not_a_run_file_is_named_and_nothing_is_sent(trained, server, tmp_path, capsys):
    good = derived(trained["thd"], tmp_path / "good.jsonl", "import-good-beside-bad")
    bad = derived(trained["thd"], tmp_path / "bad.jsonl", "import-bad")
    lines = bad.read_text().splitlines()
    lines[0] = lines[0][:-1]  # the run line cut short: not a run file at all
    bad.write_text("\n".join(lines) + "\n")
    code, _, err = run_import(capsys, good, bad, "--server", server)
    assert code == 2
    assert f"{bad}:1: not JSON" in err and "nothing was sent" in err
    assert not stored_runs(server) & {"import-good-beside-bad", "import-bad"}


def test_damaged_record_lines_are_named_and_skipped_and_the_rest_is_sent(trained, server, tmp_path, capsys):
    path = derived(trained["thd"], tmp_path / "rank0.jsonl", "import-damaged-lines")
    lines = path.read_bytes().split(b"\n")  # line 1: the run line; line k + 2: record k
    lines[4] = lines[4][:-1]  # line 5 (interval 3) cut short
    lines[6] = json.dumps({"record": {**json.loads(lines[6])["record"], "interval": "5"}}).encode()  # line 7
    path.write_bytes(b"\n".join(lines).rstrip(b"\n")[:-25])  # the last line torn, as `truncate -s -25` leaves it
    good = [r for r in read_run_file(trained["thd"]).records if r["interval"] not in (3, 5, STEPS - 1)]
    for attempt in range(2):  # a retry stores nothing twice and names the same lines
        code, out, err = run_import(capsys, path, "--server", server, "--batch", "4")
        assert code == 2, err
        assert f"{path}:5: not JSON" in err
        assert f"{path}:7: a record needs an integer 'interval', got '5'" in err
        assert f"{path}:{STEPS + 1}: not JSON" in err and "the file ends mid-line" in err
        accepted, duplicates = (0, len(good)) if attempt else (len(good), 0)
        assert f"{len(good)} records, {accepted} accepted, {duplicates} duplicates, 3 damaged lines skipped" in out
        summary = get(server, "/api/v1/runs/import-damaged-lines")
        assert summary["records"] == len(good) and summary["status"] == "finished"
        assert summary["totals"]["real_tokens"] == sum(r["real_tokens"] for r in good)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda run, recs: ({k: v for k, v in run.items() if k != "run_id"}, recs), ":1: the run line has no run_id"),
        (lambda run, recs: ({**run, "status": "done"}, recs), ":1: the run line's status must be one of"),
    ],
)
def test_a_run_file_the_importer_cannot_send_is_named_by_line(trained, server, tmp_path, capsys, edit, message):
    original = read_run_file(trained["thd"])
    run, records = edit({**original.run, "run_id": "import-unsendable"}, original.records)
    path = tmp_path / "r.jsonl"
    path.write_text("\n".join([json.dumps({"run": run}), *(json.dumps({"record": r}) for r in records)]) + "\n")
    code, _, err = run_import(capsys, path, "--server", server)
    assert code == 2 and f"{path}{message}" in err
    assert "import-unsendable" not in stored_runs(server)


def test_missing_and_binary_files_are_bad_input(tmp_path, capsys):
    binary = tmp_path / "b.jsonl"
    binary.write_bytes(b'\xff\xfe{"run": {"run_id": "x"}}\n')
    code, _, err = run_import(capsys, tmp_path / "nope.jsonl", binary, "--server", "http://127.0.0.1:9")
    assert code == 2
    assert f"{tmp_path / 'nope.jsonl'}: cannot read: No such file or directory" in err
    assert f"{binary}:1: not UTF-8 text" in err


def test_a_spool_given_to_import_is_pointed_to_sync(tmp_path, capsys):
    spool = tmp_path / "run-1.sqlite"
    db = sqlite3.connect(spool)
    db.execute("CREATE TABLE records (id INTEGER PRIMARY KEY)")
    db.close()
    code, _, err = run_import(capsys, spool, "--server", "http://127.0.0.1:9")
    assert code == 2
    assert f"{spool}: a packscope spool (SQLite), not a run file: `packscope sync {spool}` sends it" in err


def test_a_record_the_server_refuses_is_named_by_line(trained, server, tmp_path, capsys):
    def negative_tokens(records):
        return [*records[:5], {**records[5], "tokens": -1}, *records[6:]]

    path = derived(trained["thd"], tmp_path / "r.jsonl", "import-refused", records=negative_tokens)
    code, _, err = run_import(capsys, path, "--server", server)
    assert code == 2
    assert f"{path}:7: the server refuses this record: tokens:" in err  # line 1 is the run line
    assert get(server, "/api/v1/runs/import-refused")["records"] == 0  # registered, no record stored


def test_a_run_line_the_server_refuses_is_named(trained, server, tmp_path, capsys):
    path = derived(trained["thd"], tmp_path / "r.jsonl", "import-bad-layout", layout="sbhd")
    code, _, err = run_import(capsys, path, "--server", server)
    assert code == 2 and f"{path}:1: the server refuses this run line: layout:" in err
    assert get_status(server, "/api/v1/runs/import-bad-layout") == 404


def test_a_different_model_under_the_same_run_id_is_a_clear_conflict(trained, server, tmp_path, capsys):
    first = derived(trained["thd"], tmp_path / "a.jsonl", "import-conflict")
    model = read_run_file(first).run["model"]
    other = derived(
        trained["thd"], tmp_path / "b.jsonl", "import-conflict", model={**model, "layers": model["layers"] + 1}
    )
    assert run_import(capsys, first, "--server", server)[0] == 0
    code, _, err = run_import(capsys, other, "--server", server)
    assert code == 1
    assert f"{other}:1: run 'import-conflict' exists on the server with a different model" in err
    assert "give the file another run_id" in err
    assert get(server, "/api/v1/runs/import-conflict")["records"] == STEPS


def test_the_final_status_comes_from_the_run_line_when_it_says(trained, server, tmp_path, capsys):
    path = derived(trained["thd"], tmp_path / "r.jsonl", "import-failed-run", status="failed")
    assert run_import(capsys, path, "--server", server)[0] == 0
    assert get(server, "/api/v1/runs/import-failed-run")["status"] == "failed"


def test_an_ingest_token(trained, tmp_path, capsys, monkeypatch):
    path = derived(trained["thd"], tmp_path / "r.jsonl", "import-token")
    with running_server(tmp_path / "token.db", PACKSCOPE_INGEST_TOKEN="s3cret") as base:
        code, _, err = run_import(capsys, path, "--server", base)
        assert code == 1
        assert (
            f"{base} refuses our ingest token (HTTP 401)" in err
            and "--token" in err
            and "PACKSCOPE_INGEST_TOKEN" in err
        )
        assert run_import(capsys, path, "--server", base, "--token", "wrong")[0] == 1
        assert "import-token" not in stored_runs(base)
        code, out, err = run_import(capsys, path, "--server", base, "--token", "s3cret")
        assert code == 0, err
        assert f"{STEPS} accepted" in out
        monkeypatch.setenv(importer.TOKEN_ENV, "s3cret")  # the variable's name is the server's
        code, out, err = run_import(capsys, path, "--server", base)
        assert code == 0, err
        assert f"{STEPS} duplicates" in out
        assert_totals_match(get(base, "/api/v1/runs/import-token"), brute_sums(path))


def test_no_server_is_a_clear_error(trained, tmp_path, capsys):
    path = derived(trained["thd"], tmp_path / "r.jsonl", "import-nowhere")
    code, _, err = run_import(capsys, path, "--server", f"http://127.0.0.1:{free_port()}")
    assert code == 1 and "cannot reach the packscope server" in err and "packscope serve" in err


@pytest.mark.parametrize("batch", ["0", "1001", "x"])
def test_batch_sizes_outside_the_servers_limit_are_refused(trained, capsys, batch):
    with pytest.raises(SystemExit) as exit_info:
        main(["import", str(trained["thd"]), "--batch", batch])
    assert exit_info.value.code == 2
    assert "--batch" in capsys.readouterr().err


# -- what a busy server gets: a stand-in that answers 503 with Retry-After ---------------------------
class Busy(http.server.BaseHTTPRequestHandler):
    """Answers the first `busy` interval batches 503 (Retry-After: 0), and batches of more than
    `largest` records 413; takes the others, all their records new."""

    busy = 0
    largest = MAX_BATCH
    seen: ClassVar[list[str]] = []
    batches: ClassVar[list[int]] = []

    def do_POST(self) -> None:
        body = json.loads(gzip.decompress(self.rfile.read(int(self.headers["Content-Length"]))))
        type(self).seen.append(self.path)
        if not self.path.endswith("/intervals"):
            self._answer(201, {})
        elif type(self).busy > 0:
            type(self).busy -= 1
            self._answer(503, {"detail": "the database is busy"}, {"Retry-After": "0"})
        elif len(body["intervals"]) > type(self).largest:
            self._answer(413, {"detail": "the body is over the limit"})
        else:
            type(self).batches.append(len(body["intervals"]))
            self._answer(200, {"accepted": len(body["intervals"]), "duplicates": 0})

    def do_PATCH(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append("PATCH " + self.path)
        self._answer(200, {})

    def _answer(self, code: int, body: dict, headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(code)
        for key, value in {"Content-Type": "application/json", **(headers or {})}.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def busy_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    # The sender's backoff (2 s, doubling) at a hundredth of the scale, so that retries stay quick.
    monkeypatch.setattr(importer, "BACKOFF", Backoff(0.02, 0.6))
    Busy.seen, Busy.batches, Busy.busy, Busy.largest = [], [], 0, MAX_BATCH
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_503_is_retried_after_the_backoff_even_when_retry_after_says_0(trained, busy_server, capsys):
    Busy.busy = 2
    code, _, err = run_import(capsys, trained["thd"], "--server", busy_server)
    assert code == 0, err
    assert err.count("HTTP 503") == 2 and "trying again in 0.02 s" in err and "trying again in 0.04 s" in err
    assert len([p for p in Busy.seen if p.endswith("/intervals")]) == 3
    assert Busy.seen[-1].startswith("PATCH ")


def test_a_server_that_stays_busy_is_given_up_on(trained, busy_server, capsys):
    Busy.busy = 100
    code, _, err = run_import(capsys, trained["thd"], "--server", busy_server)
    assert code == 1
    assert "the server stayed busy" in err
    sent = [p for p in Busy.seen if p.endswith("/intervals")]
    assert len(sent) == importer.Client("x").retries + 1  # bounded
    assert not [p for p in Busy.seen if p.startswith("PATCH")]  # no status for a run not all sent


def test_a_batch_over_the_body_limit_is_halved(trained, busy_server, capsys):
    Busy.largest = 3
    code, out, err = run_import(capsys, trained["thd"], "--server", busy_server, "--batch", "10")
    assert code == 0, err
    assert Busy.batches == [2] * 6  # 10 refused, 5 refused, then twos: 12 records
    assert f"{STEPS} records, {STEPS} accepted, 0 duplicates" in out
