"""`packscope diagnose RUN`: the run's loss ledger (GET /api/v1/runs/{id}/ledger, docs/ledger.md)
as a terminal table, the largest measured loss first. The server derives every number; this only
lays them out. An HTTP client on the standard library, as `packscope export` is."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any
from urllib.parse import quote

from packscope.commands.importer import DEFAULT_SERVER
from packscope.commands.run_ref import UNREACHABLE, Reader, RunNotFound, resolve
from packscope.core.urls import checked_server_url

_SHORT_STATUS = {"not applicable": "n/a"}
_HEADER = ("term", "ms/step", "% of step", "GPU-hours", "status", "if removed", "fix")


def add_diagnose_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run", metavar="RUN", help="the run: its id, a unique prefix of its id, or its name")
    parser.add_argument("--server", default=DEFAULT_SERVER, help="packscope server URL (default: %(default)s)")
    parser.add_argument(
        "--token",
        default=os.environ.get("PACKSCOPE_READ_TOKEN"),
        help="read token, if the server requires one (default: PACKSCOPE_READ_TOKEN)",
    )
    parser.add_argument("--first-step", type=int, default=None, help="window start (default: the steady window)")
    parser.add_argument("--last-step", type=int, default=None, help="window end (default: the run's last step)")


def _fail(message: str, code: int = 2) -> int:
    print(f"packscope diagnose: error: {message}", file=sys.stderr)
    return code


def diagnose_from_args(args: argparse.Namespace) -> int:
    steps = {k: v for k, v in (("first_step", args.first_step), ("last_step", args.last_step)) if v is not None}
    try:
        server = checked_server_url(args.server)
        reader = Reader(server, args.token)
        run_id = resolve(reader, args.run)
        status, ledger = reader.get(f"/runs/{quote(run_id, safe='')}/ledger", **steps)
    except (ValueError, RunNotFound) as exc:
        return _fail(str(exc))
    except UNREACHABLE as exc:
        reason = getattr(exc, "reason", None) or exc
        return _fail(
            f"cannot reach the packscope server at {args.server} ({reason}); is `packscope serve` running there?", 1
        )
    if status != 200:
        return _fail(f"{server}/api/v1/runs/{run_id}/ledger answered HTTP {status}")
    print(render(ledger))
    return 0


def _number(value: float | None, digits: str) -> str:
    return "-" if value is None else format(value, digits)


def _label(term: dict[str, Any]) -> str:
    detail = term["detail"]
    if detail.get("syncs_per_iter") is not None:
        return f"{term['label']} ({detail['syncs_per_iter']:.3g}/iteration)"
    if "slowest_rank" in detail:
        return f"{term['label']} (rank {detail['slowest_rank']})"
    return str(term["label"])


def _row(term: dict[str, Any]) -> tuple[str, ...]:
    return (
        _label(term),
        _number(term["ms_per_step"], ".4g"),
        _number(term["pct_of_step"], ".1f"),
        _number(term["gpu_hours"], ".3g"),
        _SHORT_STATUS.get(term["status"], term["status"]),
        _gain(term.get("gain")),
        term["fix"],
    )


def _gain(gain: dict[str, Any] | None) -> str:
    """What removing the loss gives: the iteration's speed-up (docs/ledger.md)."""
    if not gain or gain.get("speedup_pct") is None:
        return ""
    return f"{gain['speedup_pct']:.1f}% faster"


def render(ledger: dict[str, Any]) -> str:
    """The ledger as aligned text: a heading, the losses in the server's order (the measured ones
    largest first), then the useful work and the peak they are measured against, then the
    baseline's over-count, which is a reporting error and no time."""
    losses = [t for t in ledger["terms"] if t["loss"]]
    ends = [t for t in ledger["terms"] if not t["loss"]][::-1]  # useful work, then the peak
    rows = [_HEADER, *map(_row, losses), None, *map(_row, ends)]
    widths = [max(len(r[i]) for r in rows if r is not None) for i in range(len(_HEADER) - 1)]
    numeric = (False, True, True, True, False, True)

    def line(row: tuple[str, ...]) -> str:
        cells = [
            cell.rjust(w) if right else cell.ljust(w) for cell, w, right in zip(row, widths, numeric, strict=False)
        ]
        return "  ".join([*cells, row[-1]]).rstrip()

    rule = "  ".join("-" * w for w in widths)
    window = "steady window" if ledger["window"] == "steady" else "window"
    span = "no intervals" if ledger["first_step"] is None else f"steps {ledger['first_step']}-{ledger['last_step']}"
    ranks = ledger["ranks"]
    heading = [
        f"run {ledger['run_id']}: {window}, {span}, {ranks} rank{'s' * (ranks != 1)}, layout {ledger['layout']}",
        f"step time {_number(ledger['step_time_ms'], '.4g')} ms, {_number(ledger['gpu_hours'], '.3g')} GPU-hours",
        "",
    ]
    iteration = ledger.get("iteration_ms")
    if iteration is not None and ledger["step_time_ms"] is not None and iteration > ledger["step_time_ms"]:
        heading.insert(2, f"iteration {iteration:.4g} ms: the step and the host time between steps")
    body = [rule if row is None else line(row) for row in rows]
    over = ledger["overcount"]
    pct = over["detail"].get("overcount_pct")
    tail = f"baseline over-count (a reporting error, not time): {_number(pct, '.1f')}% ({over['status']})"
    if over["fix"]:
        tail += f": {over['fix']}"
    memory = ledger.get("memory") or {}
    if memory.get("free_pct") is not None:
        tail += f"\nmemory headroom (a hint, not time): {memory['free_pct']:.0f}% of the device free"
        tail += f": {memory['hint']}" if memory.get("hint") else ""
    return "\n".join([*heading, *body, "", tail])
