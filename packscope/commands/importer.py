"""`packscope import`: run files (packscope/core/run_file.py) to a packscope server.

Every file is read before anything is sent: a file that is not a run file (its first line is not
a run line) is named by file and line and nothing is sent at all (exit code 2). A damaged record
line in a run file (torn, not JSON, not UTF-8, no integer interval or rank) is named by file and
line and skipped: the file's other records are sent, and the exit code is 2. Then, run by run
(the files of one run, one per rank, share its run_id):

    POST  /api/v1/runs?keep_status=true   each file's run line (a run that exists is resumed: 200, its status kept)
    POST  /api/v1/runs/{id}/intervals     its records, in batches (--batch, default 256)
    PATCH /api/v1/runs/{id}               the final status, once all the run's files are in

The server keys records by (run, rank, interval), so importing a file again stores nothing twice:
the summary counts those records as duplicates. The final status is the run line's optional
`status` (running, finished or failed; default finished) with its optional `ended_at` (default:
the last record's wall_end). 429 and 503, a dropped connection and a 5xx are retried a bounded
number of times, after the backoff the agent's sender uses (packscope/core/http_client.py), or
the server's Retry-After when it asks for longer.

Exit codes: 0 every run imported; 2 bad input (a file that does not read, a damaged line skipped,
or a run or record the server refuses as invalid, named by file and line); 1 anything else (no server, a wrong token, a
model conflict). Torch-free, and only the standard library for HTTP, so it runs with the server's
extra, the agent's, or the bare package.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import urllib.parse
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from packscope.core.catalogue import MAX_BATCH  # the server's limit per request (docs/wire.md)
from packscope.core.http_client import Backoff, HttpClient, HttpError, short
from packscope.core.run_file import RunFile, RunFileError, read_run_file

DEFAULT_SERVER = "http://127.0.0.1:8000"  # `packscope serve`'s default address
TOKEN_ENV = "PACKSCOPE_INGEST_TOKEN"  # the server's ingest token variable (backend/http/settings.py)
DEFAULT_BATCH = 256
STATUSES = ("running", "finished", "failed")  # what PATCH /api/v1/runs/{id} accepts
BACKOFF = Backoff()  # the sender's defaults: 2 s, doubling up to 60 s
SQLITE_MAGIC = b"SQLite format 3\x00"  # the first bytes of a spool file
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
# How import and sync register a run: not its trainer restarting, so a finished run stays finished.
REGISTER_PATH = "/api/v1/runs?keep_status=true"


class ImportFailed(Exception):
    """A run that could not be imported; `bad_input` when the server refused the file's contents."""

    def __init__(self, message: str, bad_input: bool = False, fatal: bool = False) -> None:
        super().__init__(message)
        self.bad_input = bad_input
        self.fatal = fatal  # no later run can fare better (no server, a wrong token)


# -- reading -------------------------------------------------------------------------------------
@dataclass
class LoadedFile:
    run_file: RunFile

    @property
    def path(self) -> Path:
        return self.run_file.path

    @property
    def run_id(self) -> str:
        return str(self.run_file.run["run_id"])

    @property
    def run_line(self) -> int:
        return self.run_file.run_line

    @property
    def record_lines(self) -> list[int]:
        return self.run_file.record_lines

    @property
    def bad_lines(self) -> list[str]:
        """`file:line: why` of each record line that could not be read: skipped, never sent."""
        return self.run_file.bad_lines


def load_run_files(paths: Sequence[str | Path]) -> tuple[list[LoadedFile], list[str]]:
    """Every file that reads as a run file (its damaged record lines skipped and named in
    `bad_lines`), and a `file:line: what` message for each that does not."""
    loaded: list[LoadedFile] = []
    errors: list[str] = []
    for name in paths:
        path = Path(name)
        if is_spool(path):
            errors.append(f"{path}: a packscope spool (SQLite), not a run file: `packscope sync {path}` sends it")
            continue
        try:
            run_file = read_run_file(path)
        except RunFileError as err:
            errors.append(str(err))
            continue
        except OSError as err:
            errors.append(f"{path}: cannot read: {err.strerror or err}")
            continue
        problem = _run_line_problem(run_file.run)
        if problem:
            errors.append(f"{path}:{run_file.run_line}: {problem}")
            continue
        loaded.append(LoadedFile(run_file))
    return loaded, errors


def is_spool(path: Path) -> bool:
    """Whether the file starts as an SQLite database does (what the agent spools into)."""
    try:
        with path.open("rb") as f:
            return f.read(len(SQLITE_MAGIC)) == SQLITE_MAGIC
    except OSError:
        return False


def _run_line_problem(run: dict[str, Any]) -> str | None:
    # Only what the importer itself needs; the server validates the rest and its 422 is named too.
    if not isinstance(run.get("run_id"), str) or not run["run_id"]:
        return "the run line has no run_id (a string)"
    if "status" in run and run["status"] not in STATUSES:
        return f"the run line's status must be one of {', '.join(STATUSES)}, got {run['status']!r}"
    if "ended_at" in run and not isinstance(run["ended_at"], str):
        return f"the run line's ended_at must be an ISO 8601 time, got {run['ended_at']!r}"
    return None


# -- HTTP ----------------------------------------------------------------------------------------
@dataclass
class Client:
    """The shared HTTP client (packscope/core/http_client.py) with bounded retries of what may
    pass: 429 and 503, 5xx, and a dropped connection; a refused one (nothing listens) fails now."""

    server: str
    token: str | None = None
    retries: int = 5  # further tries of a request answered 429/503, 5xx, or not at all
    timeout_s: float = 60.0
    sleep: Callable[[float], None] = time.sleep
    say: Callable[[str], None] = field(default=lambda message: print(message, file=sys.stderr, flush=True))
    backoff: Backoff | None = None  # None: the module's BACKOFF
    name: str = "import"  # the command, in the lines it says

    def __post_init__(self) -> None:
        self.http = HttpClient(self.server, self.token, self.timeout_s)
        self.server = self.http.server

    def request(self, method: str, path: str, body: Any) -> tuple[int, Any]:
        """(status, parsed JSON answer) of a 2xx; HttpError otherwise, after the retries."""
        for attempt in range(1, self.retries + 2):
            try:
                return self.http.request(method, path, body)
            except HttpError as answer:
                wait = self._retry_wait(answer, attempt)
                if wait is None or attempt > self.retries:
                    raise
                self.say(f"packscope {self.name}: {answer}; trying again in {wait:.3g} s")
                self.sleep(wait)
        raise AssertionError("unreachable")  # the loop returns or raises

    def _retry_wait(self, answer: HttpError, failures: int) -> float | None:
        backoff = self.backoff or BACKOFF
        passing = answer.status in (429, 503) or (answer.status is not None and answer.status >= 500)
        dropped = answer.status is None and not answer.nothing_listens  # a dropped connection or a timeout
        return backoff.delay(failures, answer.retry_after) if passing or dropped else None


# -- sending -------------------------------------------------------------------------------------
@dataclass
class FileResult:
    path: Path
    run_id: str
    records: int
    skipped: int = 0  # damaged lines of the file, never sent
    accepted: int = 0
    duplicates: int = 0
    resumed: bool = False  # the run was on the server already
    error: str | None = None


@dataclass
class RunResult:
    run_id: str
    files: list[FileResult]
    run: dict[str, Any]  # the first file's run line
    status: str | None = None  # the final status set, None when it was not set
    error: ImportFailed | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


def group_by_run(files: Sequence[LoadedFile]) -> dict[str, list[LoadedFile]]:
    runs: dict[str, list[LoadedFile]] = {}
    for f in files:
        runs.setdefault(f.run_id, []).append(f)
    return runs


def import_runs(
    files: Sequence[LoadedFile],
    client: Client,
    batch: int = DEFAULT_BATCH,
    say: Callable[[str], None] = print,
    progress: Callable[[str], None] | None = None,
) -> list[RunResult]:
    """Send the files run by run; a run that fails does not stop the others, unless nothing can
    succeed (the server is not there, or refuses the token). `say` gets a line per file imported,
    `progress` (default: stderr) a line per batch of a file of more than one batch."""
    progress = progress or client.say
    results: list[RunResult] = []
    fatal: ImportFailed | None = None
    for run_id, run_files in group_by_run(files).items():
        file_results = [FileResult(f.path, run_id, len(f.run_file.records), len(f.bad_lines)) for f in run_files]
        result = RunResult(run_id, file_results, run_files[0].run_file.run)
        results.append(result)
        if fatal is not None:
            result.error = ImportFailed(f"not sent: {fatal}", fatal=True)
            continue
        try:
            for loaded, file_result in zip(run_files, result.files, strict=True):
                _send_file(client, loaded, file_result, batch, progress)
                say(_file_line(file_result))
            result.status = finish_run(client, run_files)
        except ImportFailed as err:
            result.error = err
            if err.fatal:
                fatal = err
    return results


def register(client: Client, loaded: LoadedFile) -> bool:
    """POST the file's run line (without the final status); True when the run existed already."""
    run = {k: v for k, v in loaded.run_file.run.items() if k not in ("status", "ended_at")}
    try:
        status, _ = client.request("POST", REGISTER_PATH, run)
    except HttpError as answer:
        raise _failure(answer, loaded, loaded.run_line, what="registering the run") from None
    return status == 200


def _send_file(
    client: Client, loaded: LoadedFile, result: FileResult, batch: int, progress: Callable[[str], None]
) -> None:
    result.resumed = register(client, loaded)
    records = loaded.run_file.records
    path = f"/api/v1/runs/{urllib.parse.quote(loaded.run_id, safe='')}/intervals"
    start = 0
    size = batch
    while start < len(records):
        chunk = records[start : start + size]
        try:
            _, counts = client.request("POST", path, {"intervals": chunk})
        except HttpError as err:
            if err.status == 413 and size > 1:  # over the server's body limit: smaller batches
                size = max(1, size // 2)
                continue
            line = refused_line(err, loaded, start)
            raise _failure(err, loaded, line, what=f"sending records {start + 1}-{start + len(chunk)}") from None
        try:
            result.accepted += int(counts["accepted"])
            result.duplicates += int(counts["duplicates"])
        except (TypeError, KeyError, ValueError):
            raise ImportFailed(f"{loaded.path}: the server answered {short(counts)}, not an ingest result") from None
        start += len(chunk)
        if len(records) > batch:
            progress(f"  {loaded.path}: {start}/{len(records)} records sent")


def finish_run(client: Client, run_files: Sequence[LoadedFile]) -> str:
    first = run_files[0]
    run = first.run_file.run
    status = run.get("status", "finished")
    patch: dict[str, Any] = {"status": status}
    if status != "running":
        ends = [r["wall_end"] for f in run_files for r in f.run_file.records if _is_number(r.get("wall_end"))]
        if "ended_at" in run:
            patch["ended_at"] = run["ended_at"]
        elif ends:
            patch["ended_at"] = datetime.fromtimestamp(max(ends), UTC).isoformat()
    path = f"/api/v1/runs/{urllib.parse.quote(first.run_id, safe='')}"
    try:
        client.request("PATCH", path, patch)
    except HttpError as answer:
        raise _failure(answer, first, first.run_line, what=f"setting the status {status}") from None
    return str(status)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def refused_line(err: HttpError, loaded: LoadedFile, start: int) -> int | None:
    """The file line of the record a 422 names (loc: body, intervals, <index in the batch>, ...)."""
    if err.status != 422 or not isinstance(err.detail, list):
        return None
    for entry in err.detail:
        loc = entry.get("loc") if isinstance(entry, dict) else None
        if isinstance(loc, list) and len(loc) >= 3 and loc[:2] == ["body", "intervals"] and isinstance(loc[2], int):
            index = start + loc[2]
            if 0 <= index < len(loaded.record_lines):
                return loaded.record_lines[index]
    return None


def _failure(err: HttpError, loaded: LoadedFile, line: int | None, what: str) -> ImportFailed:
    where = f"{loaded.path}:{line}" if line else str(loaded.path)
    return failure(err, where, loaded.run_id, what, _kind(line, loaded))


def failure(err: HttpError, where: str, run_id: str, what: str, refused: str = "batch") -> ImportFailed:
    """What a failed request means for sending a run (`where`: the file, and line if known;
    `refused`: what a 422 refuses, e.g. "record")."""
    if err.status is None:
        return ImportFailed(
            f"cannot reach the packscope server at {err.server} ({err.detail}); is `packscope serve` running "
            "there? (--server URL names another)",
            fatal=True,
        )
    if err.status in (401, 403):
        return ImportFailed(
            f"{err.server} refuses our ingest token (HTTP {err.status}): pass the server's token with --token "
            f"or set {TOKEN_ENV}",
            fatal=True,
        )
    if err.status == 409:
        return ImportFailed(
            f"{where}: run {run_id!r} exists on the server with a different model, so these records "
            f"cannot join it ({short(err.detail)}); give the file another run_id to import it as a new run"
        )
    if err.status == 422:
        return ImportFailed(f"{where}: the server refuses this {refused}: {_errors(err.detail)}", bad_input=True)
    if err.status in (429, 503):
        return ImportFailed(f"{where}: the server stayed busy while {what}: {short(err.detail)}", fatal=True)
    return ImportFailed(f"{where}: {what} failed: {err}")


def _kind(line: int | None, loaded: LoadedFile) -> str:
    return "run line" if line == loaded.run_line else "record" if line else "batch"


def _errors(detail: Any) -> str:
    """pydantic's list of errors as `field: message; ...`."""
    if not isinstance(detail, list):
        return short(detail)
    parts = []
    for entry in detail[:5]:
        if isinstance(entry, dict):
            loc = [str(p) for p in entry.get("loc", []) if p not in ("body", "intervals") and not isinstance(p, int)]
            parts.append(f"{'.'.join(loc) or 'body'}: {entry.get('msg', entry)}")
    more = f" (and {len(detail) - 5} more)" if len(detail) > 5 else ""
    return "; ".join(parts) + more


def _file_line(result: FileResult) -> str:
    resumed = ", run already on the server" if result.resumed else ""
    skipped = f", {result.skipped} damaged lines skipped" if result.skipped else ""
    return (
        f"{result.path}: run {result.run_id}: {result.records} records, {result.accepted} accepted, "
        f"{result.duplicates} duplicates{skipped}{resumed}"
    )


def exit_code(results: Sequence[RunResult]) -> int:
    """1 when a run failed for another reason than its contents; 2 when the server refused a
    run's contents or a file had damaged lines (the rest was sent); 0 when all of it went."""
    errors = [r.error for r in results if r.error is not None]
    if any(not e.bad_input for e in errors):
        return EXIT_FAILED
    skipped = any(f.skipped for r in results for f in r.files)
    return EXIT_BAD_INPUT if errors or skipped else EXIT_OK


# -- the command ---------------------------------------------------------------------------------
def batch_size(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if not 1 <= value <= MAX_BATCH:
        raise argparse.ArgumentTypeError(f"must be from 1 to {MAX_BATCH} (the server's limit), got {value}")
    return value


def add_import_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Send run files (written by `packscope train --records-dir`, or the gallery's) to a packscope "
        "server. Importing a file again stores nothing twice."
    )
    parser.add_argument("files", nargs="+", metavar="FILE", help="run files (JSON lines), e.g. records/rank0.jsonl")
    add_sending_arguments(parser)


def add_sending_arguments(parser: argparse.ArgumentParser) -> None:
    """--server, --token and --batch, as `packscope import` and `packscope sync` take them."""
    parser.add_argument("--server", default=DEFAULT_SERVER, help="packscope server URL (default: %(default)s)")
    parser.add_argument(
        "--token",
        default=os.environ.get(TOKEN_ENV),
        help=f"ingest token, if the server requires one (default: {TOKEN_ENV})",
    )
    parser.add_argument(
        "--batch",
        type=batch_size,
        default=DEFAULT_BATCH,
        metavar="N",
        help=f"records per request, 1-{MAX_BATCH} (default: %(default)s)",
    )


def import_from_args(args: argparse.Namespace) -> int:
    files, errors = load_run_files(args.files)
    if errors:
        for message in errors:
            print(f"packscope import: error: {message}", file=sys.stderr)
        print("packscope import: nothing was sent", file=sys.stderr)
        return EXIT_BAD_INPUT
    for line in (line for f in files for line in f.bad_lines):
        print(f"packscope import: error: {line}; skipped, the file's other records are sent", file=sys.stderr)
    client = Client(args.server, args.token)
    results = import_runs(files, client, args.batch)
    for result in results:
        if result.ok:
            print(f"run {result.run_id}: {result.status}  {client.server}/runs/{urllib.parse.quote(result.run_id)}")
        else:
            print(f"packscope import: error: {result.error}", file=sys.stderr)
    failed = sum(not r.ok for r in results)
    if failed:
        print(f"packscope import: {failed} of {len(results)} runs not imported", file=sys.stderr)
    return exit_code(results)
