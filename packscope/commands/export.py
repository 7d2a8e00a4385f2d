"""`packscope export`: a run's intervals as the server's CSV export, with the run named by its id,
a unique id prefix or its name (packscope/commands/run_ref.py) and the server URL checked before
anything is asked of it. An HTTP client on the standard library: it needs neither the server's
extra nor the agent's."""

from __future__ import annotations

import argparse
import io
import os
import sys
import urllib.error
from pathlib import Path
from typing import TextIO
from urllib.parse import quote

from packscope.commands.importer import DEFAULT_SERVER
from packscope.commands.run_ref import UNREACHABLE, Reader, RunNotFound, resolve
from packscope.core.urls import checked_server_url

CHUNK_CHARS = 1 << 16


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", default=DEFAULT_SERVER, help="packscope server URL (default: %(default)s)")
    parser.add_argument(
        "--run", required=True, metavar="RUN", help="the run: its id, a unique prefix of its id, or its name"
    )
    parser.add_argument("-o", "--output", default=None, help="CSV file to write (default: RUN_ID.csv; '-' for stdout)")
    parser.add_argument(
        "--token",
        default=os.environ.get("PACKSCOPE_READ_TOKEN"),
        help="read token, if the server requires one (default: PACKSCOPE_READ_TOKEN)",
    )


def _fail(message: str, code: int = 2) -> int:
    print(f"packscope export: error: {message}", file=sys.stderr)
    return code


def _unreachable(server: str, exc: BaseException) -> int:
    reason = getattr(exc, "reason", None) or exc  # urllib's URLError wraps the socket's error
    return _fail(f"cannot reach the packscope server at {server} ({reason}); is `packscope serve` running there?", 1)


def export_from_args(args: argparse.Namespace) -> int:
    try:
        server = checked_server_url(args.server)
        reader = Reader(server, args.token)
        run_id = resolve(reader, args.run)
    except (ValueError, RunNotFound) as exc:
        return _fail(str(exc))
    except UNREACHABLE as exc:
        return _unreachable(args.server, exc)
    return download(reader, run_id, args.output or f"{run_id}.csv")


class _CannotWrite(Exception):
    """Writing the CSV failed (the OSError is its cause), as opposed to reading the answer."""


def download(reader: Reader, run_id: str, output: str) -> int:
    """The run's CSV into `output` ('-': stdout), through a file beside it renamed at the end, so
    that a failure never leaves half a file."""
    server = reader.server
    path = f"/runs/{quote(run_id, safe='')}/intervals.csv"
    try:
        response = reader.open(path)
    except urllib.error.HTTPError as err:
        if err.code == 404:
            return _fail(f"run {run_id!r} is not stored on {server}; {server}/api/v1/runs lists the runs")
        return _fail(f"{server}/api/v1{path} answered HTTP {err.code}: {err.read()[:300]!r}")
    except RunNotFound as exc:  # a read token became needed since the run was resolved
        return _fail(str(exc))
    except UNREACHABLE as exc:
        return _unreachable(server, exc)
    to_stdout = output == "-"
    partial = Path(f"{output}.part")
    with response:
        try:
            sink = sys.stdout if to_stdout else partial.open("w", encoding="utf-8", newline="")
        except OSError as exc:
            return _fail(f"cannot write {output}: {exc}")
        try:
            rows = _copy(io.TextIOWrapper(response, encoding="utf-8", newline=""), sink)
        except (_CannotWrite, *UNREACHABLE) as exc:
            if not to_stdout:
                sink.close()
                partial.unlink(missing_ok=True)
            if isinstance(exc, _CannotWrite):
                return _fail(f"cannot write {output}: {exc.__cause__}")
            return _unreachable(server, exc)
    if not to_stdout:
        sink.close()
        partial.replace(output)
        print(f"packscope: wrote {max(rows - 1, 0)} intervals of run {run_id!r} to {output}", file=sys.stderr)
    return 0


def _copy(text: TextIO, sink: TextIO) -> int:
    """Copy `text` into `sink`; the lines copied."""
    lines = 0
    while chunk := text.read(CHUNK_CHARS):
        try:
            sink.write(chunk)
        except OSError as exc:
            raise _CannotWrite from exc
        lines += chunk.count("\n")
    return lines
