"""`packscope sync`: send whatever runs left on disk to a server, exactly once.

    packscope sync [PATH ...] --server URL

A PATH is a spool file (`<run_id>.sqlite`: the agent keeps there what it has not delivered, and
all of an offline run, `server=None` with a `spool_dir`), a run file (JSON lines, `packscope
train --records-dir`), or a directory searched, with its sub-directories (`rank<r>/`), for both.
Without a PATH: the agent's spool directory, ~/.cache/packscope/spool. Every named input is read
before anything is sent; one that is neither kind, or a malformed `--server`, is bad input (exit
2) and nothing is sent. In a directory, files of neither kind are skipped and said so.

Exactly once, and resumable after a kill at any point:

* a spool: its records are deleted from it once the server has them, as the agent's sender does,
  so a later sync goes on where a killed one stopped; at worst it sends the batch that was in
  flight again, which the server stores once (its key is run, rank, interval) and counts as a
  duplicate. Set-aside records within their retry caps get one more try each. The run's final
  status, if the run left one, is set last; a spool with nothing left in it is removed. A
  damaged spool is first rebuilt from what still reads of it (core/spool_salvage.py), the
  damaged file kept beside it as `<name>.corrupt-<time>`: named, with what was lost, by this
  sync and every later one (the agent's damaged spools too).
* a run file: how far each server has taken it is kept beside it, in `<file>.sync.json`, after
  every batch; a file changed since starts over (the server stores nothing twice). Its damaged
  lines (core/run_file.py) are skipped, and named by every sync.

So a second sync sends nothing. Exit codes: 0 everything sent; 2 bad input, damaged lines or
spools (records that could not be read), or a record the server refuses as invalid (named by
file and line; a spool's is set aside in it); 1 anything else (no server, a wrong token, a
server that stayed busy: run sync again later). Torch-free, like
`packscope import`.
"""

from __future__ import annotations

import argparse
import functools
import json
import sqlite3
import sys
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from packscope.commands.importer import (
    DEFAULT_SERVER,
    EXIT_BAD_INPUT,
    EXIT_FAILED,
    EXIT_OK,
    REGISTER_PATH,
    Client,
    ImportFailed,
    LoadedFile,
    add_sending_arguments,
    failure,
    finish_run,
    is_spool,
    load_run_files,
    refused_line,
    register,
)
from packscope.core.http_client import HttpError
from packscope.core.spool import (
    DEFAULT_SPOOL_DIR,
    FINAL_KEY,
    FORMAT_VERSION,
    RUN_KEY,
    SET_ASIDE_MAX_AGE_S,
    SET_ASIDE_MAX_ATTEMPTS,
    Entry,
    Spool,
    SpoolDamaged,
    SpoolError,
    is_damaged_copy,
)
from packscope.core.spool_salvage import Salvage, salvage

STATE_SUFFIX = ".sync.json"  # beside a run file: how far each server has taken it
PLAIN_EVERY_S = 10.0  # off a terminal: at most one progress line this often
NOT_SENT_STATUSES = (401, 403, 404, 408, 409, 429, 502, 503, 504)  # failures that say nothing of the records


# -- what is on disk -----------------------------------------------------------------------------
@dataclass
class SpoolInput:
    path: Path
    run: dict[str, Any]  # the run's registration body, kept by the agent's sender
    records: int  # waiting in the spool
    set_aside: int  # set aside, still within their retry caps
    given_up: int  # set aside past their caps: they stay in the file, with the reason
    final: bool  # a final status is still to be set
    damaged: bool = False  # SQLite finds the file damaged: what reads of it is salvaged first

    @property
    def pending(self) -> bool:
        return bool(self.records or self.set_aside or self.final or self.damaged)


@dataclass
class RunFileInput:
    loaded: LoadedFile
    state: RunFileState

    @property
    def path(self) -> Path:
        return self.loaded.path

    @property
    def pending(self) -> int:
        return len(self.loaded.run_file.records) - self.state.sent


@dataclass
class RunFileState:
    """`<file>.sync.json`: per server, the file's size and mtime when it was read, the records
    sent (the first `sent`, in file order) and whether the final status was set."""

    path: Path  # the state file
    server: str
    stamp: list[int]  # [size, mtime_ns] of the run file
    sent: int = 0
    status_set: bool = False

    @classmethod
    def read(cls, run_file: Path, server: str) -> RunFileState:
        path = run_file.with_name(run_file.name + STATE_SUFFIX)
        info = run_file.stat()
        stamp = [info.st_size, info.st_mtime_ns]
        try:
            saved = json.loads(path.read_text()).get(server, {})
        except (OSError, ValueError, AttributeError):
            saved = {}
        if saved.get("stamp") != stamp:  # a new or changed file: everything again
            return cls(path, server, stamp)
        return cls(path, server, stamp, int(saved.get("sent", 0)), bool(saved.get("status_set", False)))

    def save(self) -> None:
        try:
            every = json.loads(self.path.read_text())
        except (OSError, ValueError):
            every = {}
        if not isinstance(every, dict):
            every = {}
        every[self.server] = {"stamp": self.stamp, "sent": self.sent, "status_set": self.status_set}
        tmp = self.path.with_name(self.path.name + ".tmp")
        tmp.write_text(json.dumps(every, indent=1) + "\n")
        tmp.replace(self.path)  # a kill leaves the old state or the new one, never half of one


@dataclass
class Inputs:
    spools: list[Path] = field(default_factory=list)
    run_files: list[Path] = field(default_factory=list)
    damaged: list[Path] = field(default_factory=list)  # damaged spools set aside (by the agent or a sync)
    errors: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def find_inputs(names: Sequence[str | Path]) -> Inputs:
    """Named files must be a spool or a run file (or a damaged spool set aside); in a directory,
    files of neither kind are skipped (a note says so)."""
    inputs = Inputs()
    spools, run_files, errors, notes = inputs.spools, inputs.run_files, inputs.errors, inputs.notes
    for name in names:
        path = Path(name).expanduser()
        if path.is_file() and is_damaged_copy(path):
            inputs.damaged.append(path)
        elif path.is_dir():
            found = sorted(p for p in path.rglob("*") if p.suffix in (".sqlite", ".jsonl") and p.is_file())
            inputs.damaged += sorted(p for p in path.rglob("*") if is_damaged_copy(p) and p.is_file())
            for file in found:
                kind = _kind_of(file)
                if kind is None:
                    notes.append(f"{file}: neither a spool nor a run file; skipped")
                (spools if kind == "spool" else run_files if kind == "run file" else []).append(file)
        elif path.is_file():
            kind = _kind_of(path)
            if kind is None:
                errors.append(
                    f"{path}: neither a packscope spool (SQLite, <run_id>.sqlite) nor a run file (JSON lines "
                    'starting with {"run": ...})'
                )
            (spools if kind == "spool" else run_files if kind == "run file" else []).append(path)
        else:
            errors.append(f"{path}: no such file or directory")
    return inputs


def _kind_of(path: Path) -> str | None:
    if is_spool(path):
        return "spool"
    try:
        with path.open("rb") as f:  # only the first line decoded: a damaged later line is the reader's to name
            first = next((line for line in f if line.strip()), b"")
        value = json.loads(first.decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return "run file" if isinstance(value, dict) and isinstance(value.get("run"), dict) else None


def read_spool(path: Path) -> tuple[SpoolInput | None, str | None]:
    """The spool's run and counts, read without writing to it; or what is wrong with it."""
    try:
        db = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    except sqlite3.Error as err:
        return None, f"{path}: cannot open the spool: {err}"
    try:
        tables = {row[0] for row in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        if not {"records", "totals", "set_aside", "meta"} <= tables:
            return None, f"{path}: an SQLite file, but not a packscope spool (no records, totals, meta tables)"
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > FORMAT_VERSION:
            return None, f"{path}: written by a newer packscope (spool format {version}); upgrade packscope to send it"
        if not _sound(db):
            return _damaged_spool(db, path)
        row = db.execute("SELECT value FROM meta WHERE key = ?", (RUN_KEY,)).fetchone()
        final = db.execute("SELECT 1 FROM meta WHERE key = ?", (FINAL_KEY,)).fetchone() is not None
        records = db.execute("SELECT records FROM totals").fetchone()[0]
        aside, retryable = db.execute(
            "SELECT count(*), coalesce(sum(attempts < ? AND since > ?), 0) FROM set_aside",
            (SET_ASIDE_MAX_ATTEMPTS, time.time() - SET_ASIDE_MAX_AGE_S),
        ).fetchone()
    except sqlite3.Error as err:
        return None, f"{path}: cannot read the spool: {err}"
    finally:
        db.close()
    if row is None:
        return None, (
            f"{path}: the spool does not hold its run's registration (an older packscope wrote it); an agent "
            "started with the same run_id sends its records"
        )
    return SpoolInput(path, json.loads(row[0]), int(records), int(retryable), int(aside - retryable), final), None


def _sound(db: sqlite3.Connection) -> bool:
    """SQLite's own check of every page of the file (a read of all of it, as sending is)."""
    try:
        return [row[0] for row in db.execute("PRAGMA quick_check")] == ["ok"]
    except sqlite3.DatabaseError:
        return False


def _damaged_spool(db: sqlite3.Connection, path: Path) -> tuple[SpoolInput | None, str | None]:
    """A damaged spool as far as it reads: its run (needed to send anything) and record count."""
    try:
        row = db.execute("SELECT value FROM meta WHERE key = ?", (RUN_KEY,)).fetchone()
        run = json.loads(row[0]) if row else None
    except (sqlite3.DatabaseError, ValueError):
        run = None
    if not isinstance(run, dict):
        return None, f"{path}: the spool is damaged and its run's registration cannot be read: none of it can be sent"
    try:
        records = int(db.execute("SELECT records FROM totals").fetchone()[0])
    except (sqlite3.DatabaseError, TypeError):
        records = 0
    return SpoolInput(path, run, records, 0, 0, False, damaged=True), None


# -- progress ------------------------------------------------------------------------------------
class Progress:
    """On a terminal, a tqdm bar of records sent when tqdm is installed (the [trainer] extra
    brings it). Elsewhere (a pipe, a log file), where a bar's carriage returns would garble the
    log, a plain line of records sent at most every PLAIN_EVERY_S, then a line per run."""

    def __init__(self, total: int) -> None:
        self._bar: Any = None
        self._total, self._sent = total, 0
        self._next_line = time.monotonic() + PLAIN_EVERY_S
        if not sys.stderr.isatty():
            return
        try:
            from tqdm import tqdm
        except ImportError:
            return
        self._bar = tqdm(total=total, unit="record", desc="packscope sync", file=sys.stderr, dynamic_ncols=True)

    def update(self, n: int) -> None:
        self._sent += n
        if self._bar is not None:
            self._bar.update(n)
        elif time.monotonic() >= self._next_line:
            print(f"packscope sync: {self._sent}/{self._total} records sent", file=sys.stderr, flush=True)
            self._next_line = time.monotonic() + PLAIN_EVERY_S

    def write(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=sys.stdout)
        else:
            print(line, flush=True)

    def warn(self, line: str) -> None:
        if self._bar is not None:
            self._bar.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()


# -- sending -------------------------------------------------------------------------------------
@dataclass
class Outcome:
    path: Path
    run_id: str
    sent: int = 0
    accepted: int = 0
    duplicates: int = 0
    set_aside_ids: list[int] = field(default_factory=list)  # refused by the server now, kept in the spool
    recovered: int = 0  # set aside before, taken now
    refused_again: int = 0  # set aside before, refused once more
    status: str | None = None  # the final status set
    skipped: int = 0  # damaged lines of a run file, never sent
    salvage: Salvage | None = None  # the spool was damaged: what was read of it
    error: ImportFailed | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def delivered(self) -> bool:
        """The server took records (new or duplicates) or the final status: its page shows them."""
        return self.sent > 0 or self.status is not None

    @property
    def lost(self) -> bool:
        """Records of a damaged spool could not be read."""
        return self.salvage is not None and not self.salvage.complete

    def line(self) -> str:
        parts = [f"{self.sent} records sent ({self.accepted} accepted, {self.duplicates} duplicates)"]
        if self.recovered:
            parts.append(f"{self.recovered} set aside before now taken")
        if self.set_aside_ids:
            parts.append(f"{len(self.set_aside_ids)} refused and set aside in the spool")
        if self.refused_again:
            parts.append(f"{self.refused_again} set aside before refused again")
        if self.skipped:
            parts.append(f"{self.skipped} damaged lines skipped")
        if self.status:
            parts.append(f"status {self.status}")
        return f"{self.path}: run {self.run_id}: " + ", ".join(parts)


def _intervals_path(run_id: str) -> str:
    return f"/api/v1/runs/{urllib.parse.quote(run_id, safe='')}/intervals"


def _counts(answer: Any, where: str) -> tuple[int, int]:
    try:
        return int(answer["accepted"]), int(answer["duplicates"])
    except (TypeError, KeyError, ValueError):
        raise ImportFailed(f"{where}: the server answered {answer!r:.200}, not an ingest result") from None


def _refuses(err: HttpError) -> bool:
    """A 4xx about the records themselves (not the token, the run, or the server's load)."""
    return err.status is not None and 400 <= err.status < 500 and err.status not in NOT_SENT_STATUSES


@contextmanager
def _opened(path: Path) -> Iterator[Spool]:
    spool = Spool(path, max_bytes=2**62, quarantine=False)  # sync evicts nothing; a damaged file is salvaged
    spool.open()
    try:
        yield spool
    finally:
        spool.close(remove_if_empty=True)


def sync_spool(client: Client, spool_input: SpoolInput, batch: int, progress: Progress) -> Outcome:
    run = spool_input.run
    run_id = str(run.get("run_id", ""))
    outcome = Outcome(spool_input.path, run_id)
    where = str(spool_input.path)
    try:
        client.request("POST", REGISTER_PATH, run)
    except HttpError as err:
        raise failure(err, where, run_id, "registering the run", "run registration") from None
    if spool_input.damaged:
        _salvage(spool_input.path, outcome, progress)
    try:
        try:
            _send_spool(client, spool_input.path, outcome, batch, progress)
        except SpoolDamaged:  # found by a read that SQLite's check let through
            if outcome.salvage is not None:
                raise
            _salvage(spool_input.path, outcome, progress)
            _send_spool(client, spool_input.path, outcome, batch, progress)
    except SpoolError as err:  # an I/O error, or a file still damaged after its salvage
        raise ImportFailed(f"{where}: {err}") from None
    return outcome


def _salvage(path: Path, outcome: Outcome, progress: Progress) -> None:
    """Rebuild the damaged spool from what reads of it; what does not is said at once, never sent."""
    try:
        outcome.salvage = salvage(path)
    except SpoolError as err:
        raise ImportFailed(str(err), bad_input=True) from None
    if outcome.lost:
        progress.warn(f"packscope sync: error: {outcome.salvage.describe()}")
    else:
        progress.write(f"packscope sync: {outcome.salvage.describe()}")


def _send_spool(client: Client, path: Path, outcome: Outcome, batch: int, progress: Progress) -> None:
    run_id, where = outcome.run_id, str(path)
    with _opened(path) as spool:
        size = batch
        while entries := spool.head(size):
            try:
                counts = _post(client, run_id, entries, where)
            except HttpError as err:
                if not _refuses(err):
                    raise failure(err, where, run_id, f"sending {len(entries)} records") from None
                if len(entries) > 1:  # halve until the refused records are alone
                    size = (len(entries) + 1) // 2
                    continue
                spool.set_aside(entries, "rejected", str(err))
                outcome.set_aside_ids.append(entries[0].id)
                outcome.notes.append(f"{where}: interval {_interval(entries[0])} refused and set aside: {err}")
                size = batch
                continue
            spool.ack(entries)
            _count(outcome, counts, len(entries))
            progress.update(len(entries))
        _retry_set_aside(client, spool, run_id, outcome, where, progress)
        final = spool.meta(FINAL_KEY)
        if final is not None:
            run_path = f"/api/v1/runs/{urllib.parse.quote(run_id, safe='')}"
            try:
                client.request("PATCH", run_path, final)
            except HttpError as err:
                raise failure(err, where, run_id, f"setting the status {final.get('status')}") from None
            spool.set_meta(FINAL_KEY, None)
            outcome.status = str(final.get("status"))


def _post(client: Client, run_id: str, entries: list[Entry], where: str) -> tuple[int, int]:
    data = ('{"intervals":[' + ",".join(e.body for e in entries) + "]}").encode()
    return _counts(client.request("POST", _intervals_path(run_id), data)[1], where)


def _retry_set_aside(
    client: Client, spool: Spool, run_id: str, outcome: Outcome, where: str, progress: Progress
) -> None:
    """One more try, alone, for each set-aside record within its caps (attempts, age), but not
    for those this sync has just set aside."""
    tried: set[int] = set(outcome.set_aside_ids)
    while due := [e for e in spool.due_set_aside(len(tried) + 1, retry_s=0) if e.id not in tried]:
        entry = due[0]
        tried.add(entry.id)
        try:
            counts = _post(client, run_id, [entry], where)
        except HttpError as err:
            if not (_refuses(err) or (err.status is not None and err.status >= 500)):
                raise failure(err, where, run_id, "sending a set-aside record") from None
            spool.failed_again([entry], str(err))
            outcome.refused_again += 1
            outcome.notes.append(f"{where}: interval {_interval(entry)}, set aside before, refused again: {err}")
            continue
        spool.delivered_set_aside([entry])
        outcome.recovered += 1
        _count(outcome, counts, 1)
        progress.update(1)


def _count(outcome: Outcome, counts: tuple[int, int], n: int) -> None:
    outcome.sent += n
    outcome.accepted += counts[0]
    outcome.duplicates += counts[1]


def _interval(entry: Entry) -> object:
    try:
        return entry.record.get("interval", "?")
    except (ValueError, AttributeError):
        return "?"


def sync_run_files(client: Client, files: Sequence[RunFileInput], batch: int, progress: Progress) -> list[Outcome]:
    """The files of one run, then its final status once all of them are in."""
    outcomes = []
    for item in files:
        outcome = Outcome(item.path, item.loaded.run_id, skipped=len(item.loaded.bad_lines))
        outcomes.append(outcome)
        if item.pending == 0 and item.state.status_set:
            continue
        register(client, item.loaded)
        records = item.loaded.run_file.records
        size = batch
        while item.state.sent < len(records):
            start = item.state.sent
            chunk = records[start : start + size]
            try:
                _, answer = client.request("POST", _intervals_path(item.loaded.run_id), {"intervals": chunk})
            except HttpError as err:
                if err.status == 413 and size > 1:  # over the server's body limit: smaller batches
                    size = max(1, size // 2)
                    continue
                line = refused_line(err, item.loaded, start)
                where = f"{item.path}:{line}" if line else str(item.path)
                what = f"sending records {start + 1}-{start + len(chunk)}"
                raise failure(err, where, item.loaded.run_id, what, "record" if line else "batch") from None
            _count(outcome, _counts(answer, str(item.path)), len(chunk))
            item.state.sent += len(chunk)
            item.state.save()
            progress.update(len(chunk))
    if not all(item.state.status_set for item in files):
        status = finish_run(client, [item.loaded for item in files])
        for item, outcome in zip(files, outcomes, strict=True):
            item.state.status_set = True
            item.state.save()
            outcome.status = status
    return outcomes


# -- the command ---------------------------------------------------------------------------------
def server_url_problem(url: str) -> str | None:
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"--server {url!r} is not a server URL; give one like {DEFAULT_SERVER}"
    try:
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as err:
        return f"--server {url!r}: {err}"
    return None


def add_sync_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Send whatever runs left on disk (spools: runs whose server was away or wrong, offline runs; run "
        "files) to a packscope server, exactly once. Resumable: run it again after a failure or a kill; "
        "a second sync sends nothing."
    )
    parser.add_argument(
        "paths",
        nargs="*",
        metavar="PATH",
        default=[DEFAULT_SPOOL_DIR],
        help=f"spool files (.sqlite), run files (.jsonl) or directories of them (default: {DEFAULT_SPOOL_DIR})",
    )
    add_sending_arguments(parser)


def _error(message: str) -> None:
    print(f"packscope sync: error: {message}", file=sys.stderr)


def sync_from_args(args: argparse.Namespace) -> int:
    problem = server_url_problem(args.server)
    inputs = find_inputs(args.paths)
    errors, notes = inputs.errors, inputs.notes
    spools = []
    for path in inputs.spools:
        spool_input, problem_of_spool = read_spool(path)
        if spool_input is None:
            errors.append(str(problem_of_spool))
        else:
            spools.append(spool_input)
    loaded, file_errors = load_run_files(inputs.run_files)
    errors += file_errors
    # What is here but cannot be sent, named on every sync (exit 2) until someone has looked.
    unsent = [f"{line}; skipped, the file's other records are sent" for f in loaded for line in f.bad_lines]
    unsent += [
        f"{path}: a damaged spool set aside; records in it that could not be read never reached a server (a "
        "sync sends what it can read of a damaged spool, the agent sets one aside unread); delete it once "
        "you have looked at it"
        for path in inputs.damaged
    ]
    if problem:
        errors.insert(0, problem)
    if errors:
        for message in errors:
            _error(message)
        print("packscope sync: nothing was sent", file=sys.stderr)
        return EXIT_BAD_INPUT
    notes += [
        f"{s.path}: {s.given_up} records set aside past their retry caps stay in it (table set_aside, with the "
        "server's reason)"
        for s in spools
        if s.given_up
    ]
    for note in notes:
        print(f"packscope sync: {note}", file=sys.stderr)
    for message in unsent:
        _error(message)
    client = Client(args.server, args.token, name="sync")
    run_files = [RunFileInput(f, RunFileState.read(f.path, client.server)) for f in loaded]
    pending = [s for s in spools if s.pending] + [f for f in run_files if not f.state.status_set]
    if not pending:
        if unsent:
            print("packscope sync: nothing else to send: only what is named above was never sent", file=sys.stderr)
            return EXIT_BAD_INPUT
        print("packscope sync: nothing to send: every run here has been sent")
        return EXIT_OK
    progress = Progress(sum(s.records + s.set_aside for s in spools) + sum(f.pending for f in run_files))
    code = _send_all(client, spools, run_files, args.batch, progress)
    progress.close()
    if unsent:
        print(f"packscope sync: {len(unsent)} damaged lines or files (above) not sent", file=sys.stderr)
        return code if code == EXIT_FAILED else EXIT_BAD_INPUT
    return code


def _spool_job(client: Client, spool_input: SpoolInput, batch: int, progress: Progress) -> list[Outcome]:
    return [sync_spool(client, spool_input, batch, progress)]


def _send_all(
    client: Client, spools: list[SpoolInput], run_files: list[RunFileInput], batch: int, progress: Progress
) -> int:
    """Run by run (a spool, or the run files of one run); a run that fails does not stop the
    others unless none can succeed (no server, a wrong token)."""
    jobs: list[tuple[str, Callable[[], list[Outcome]]]] = []
    for spool_input in spools:
        if spool_input.pending:
            run_id = str(spool_input.run.get("run_id"))
            jobs.append((run_id, functools.partial(_spool_job, client, spool_input, batch, progress)))
    by_run: dict[str, list[RunFileInput]] = {}
    for item in run_files:
        by_run.setdefault(item.loaded.run_id, []).append(item)
    for run_id, items in by_run.items():
        if not all(item.state.status_set for item in items):
            jobs.append((run_id, functools.partial(sync_run_files, client, items, batch, progress)))
    errors: list[ImportFailed] = []
    refused = lost = False
    delivered_runs: list[str] = []  # their pages are worth a link: the server holds something new of them
    for run_id, job in jobs:
        try:
            outcomes = job()
        except ImportFailed as err:
            errors.append(err)
            if err.fatal:
                break
            continue
        for outcome in outcomes:
            progress.write(outcome.line())
            for note in outcome.notes:
                progress.write(f"packscope sync: {note}")
            refused = refused or bool(outcome.set_aside_ids) or outcome.refused_again > 0
            lost = lost or outcome.lost
        if any(outcome.delivered for outcome in outcomes) and run_id not in delivered_runs:
            delivered_runs.append(run_id)
    for run_id in delivered_runs:
        progress.write(f"run {run_id}: {client.server}/runs/{urllib.parse.quote(run_id)}")
    for failed in errors:
        _error(str(failed))
    if errors:
        print(
            f"packscope sync: {len(errors)} of {len(jobs)} runs not sent in full; run sync again to resume",
            file=sys.stderr,
        )
    if refused:
        print(
            "packscope sync: records the server refused stay set aside in their spool, with the reason", file=sys.stderr
        )
    if lost:
        print("packscope sync: records of a damaged spool could not be read and were not sent (above)", file=sys.stderr)
    if any(not e.bad_input for e in errors):
        return EXIT_FAILED
    return EXIT_BAD_INPUT if errors or refused or lost else EXIT_OK
