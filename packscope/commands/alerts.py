"""`packscope alerts`: the server's open alerts (GET /api/v1/alerts, docs/alerts.md) as a terminal
table, newest first. The server judges every rule; this only lays the answer out. An HTTP client
on the standard library, as `packscope export` is."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

from packscope.commands.importer import DEFAULT_SERVER
from packscope.commands.run_ref import UNREACHABLE, Reader, RunNotFound
from packscope.core.urls import checked_server_url

_HEADER = ("opened", "run", "rule", "subject", "summary")


def add_alerts_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--server", default=DEFAULT_SERVER, help="packscope server URL (default: %(default)s)")
    parser.add_argument(
        "--token",
        default=os.environ.get("PACKSCOPE_READ_TOKEN"),
        help="read token, if the server requires one (default: PACKSCOPE_READ_TOKEN)",
    )
    parser.add_argument("--all", action="store_true", help="resolved alerts too (a column says when)")


def _fail(message: str, code: int = 2) -> int:
    print(f"packscope alerts: error: {message}", file=sys.stderr)
    return code


def alerts_from_args(args: argparse.Namespace) -> int:
    state = "all" if args.all else "open"
    try:
        server = checked_server_url(args.server)
        status, listed = Reader(server, args.token).get("/alerts", state=state)
    except (ValueError, RunNotFound) as exc:
        return _fail(str(exc))
    except UNREACHABLE as exc:
        reason = getattr(exc, "reason", None) or exc
        return _fail(
            f"cannot reach the packscope server at {args.server} ({reason}); is `packscope serve` running there?", 1
        )
    if status != 200:
        return _fail(f"{server}/api/v1/alerts answered HTTP {status}")
    print(render(listed, resolved_column=args.all))
    return 0


def _when(iso: str | None) -> str:
    return "-" if iso is None else iso.replace("T", " ")[:19]


def render(alerts: list[dict[str, Any]], resolved_column: bool = False) -> str:
    """The alerts as aligned text, one line each; "no open alerts" when there are none."""
    if not alerts:
        return "no alerts" if resolved_column else "no open alerts"
    header = (*_HEADER[:-1], "resolved", _HEADER[-1]) if resolved_column else _HEADER
    rows = []
    for a in alerts:
        run = a["run_name"] or a["run_id"]
        cells = [
            _when(a["opened_at"]),
            run if run == a["run_id"] else f"{run} ({a['run_id']})",
            a["rule"],
            a["subject"] or "-",
        ]
        if resolved_column:
            cells.append(_when(a["resolved_at"]) if a["resolved_at"] else "open")
        rows.append((*cells, a["summary"]))
    table = [header, *rows]
    widths = [max(len(r[i]) for r in table) for i in range(len(header) - 1)]
    return "\n".join("  ".join([*(c.ljust(w) for c, w in zip(r, widths, strict=False)), r[-1]]).rstrip() for r in table)
