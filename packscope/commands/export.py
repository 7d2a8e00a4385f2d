"""`packscope export`: the server's CSV export of a run (packscope/commands/serve.py downloads it), with the run
named by its id, a unique id prefix or its name (packscope/commands/run_ref.py) and the server URL checked
before anything is asked of it."""

from __future__ import annotations

import argparse
import sys

from packscope.commands import serve as backend_cli
from packscope.commands.run_ref import Reader, RunNotFound, resolve
from packscope.core.urls import checked_server_url


def add_export_arguments(parser: argparse.ArgumentParser) -> None:
    backend_cli.add_export_arguments(parser)
    for action in parser._actions:
        if "--run" in action.option_strings:
            action.metavar = "RUN"
            action.help = "the run: its id, a unique prefix of its id, or its name"


def export_from_args(args: argparse.Namespace) -> int:
    import httpx

    try:
        server = checked_server_url(args.server)
        args.run = resolve(Reader(server, args.token), args.run)
    except (ValueError, RunNotFound) as exc:
        print(f"packscope export: error: {exc}", file=sys.stderr)
        return 2
    except httpx.TransportError as exc:
        print(
            f"packscope export: error: cannot reach the packscope server at {args.server} ({exc}); "
            "is `packscope serve` running there?",
            file=sys.stderr,
        )
        return 1
    args.server = server
    return backend_cli.export_from_args(args)
