"""A run as a file: what the agent would have sent to a server, kept as JSON lines.

    {"run": {...}}        first line: the run's registration body (POST /api/v1/runs)
    {"record": {...}}     then one line per interval record (POST /api/v1/runs/{id}/intervals)

One file per rank; the files of one run share the run line's run_id, and the server sums the
ranks as it does live. Written by `packscope train --records-dir`, read by `packscope import`,
`packscope sync` (and the demo's gallery of GPU runs). Torch-free, so the importer runs anywhere.
A damaged record line (torn, not JSON, not UTF-8) is skipped and named; the rest still reads.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class RunFileError(ValueError):
    """A file that is not a run file (no run line first), named by file and line number."""


@dataclass
class RunFile:
    path: Path
    run: dict[str, Any]
    records: list[dict[str, Any]]
    run_line: int = 1  # the file's line number of the run line...
    record_lines: list[int] = field(default_factory=list)  # ...and of each record
    bad_lines: list[str] = field(default_factory=list)  # `file:line: why` of each line skipped


def write_run_file(path: str | Path, run: dict[str, Any], records: Iterable[dict[str, Any]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"run": run}, default=str)]
    lines += [json.dumps({"record": record}) for record in records]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)  # never a half-written file under the final name
    return path


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any] | str]]:
    """(line number, its one-key object) of each non-blank line, or (number, why it is not one).
    Lines are decoded one by one, so a line of garbage bytes spoils only itself."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            torn = "" if raw.endswith(b"\n") else "; the file ends mid-line (a torn write?)"
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as err:
                yield number, f"not UTF-8 text (byte {err.start}){torn}"
                continue
            if not text.strip():
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as err:
                yield number, f"not JSON ({err.msg}){torn}"
                continue
            if not (isinstance(value, dict) and len(value) == 1 and isinstance(next(iter(value.values())), dict)):
                yield number, 'expected {"run": {...}} or {"record": {...}}'
                continue
            yield number, value


def read_run_file(path: str | Path) -> RunFile:
    """The run line and every record line; the server validates their contents. A file whose
    first line is not a run line is not a run file (RunFileError); after it, a line that is not a
    record (torn, garbage, another run line) is skipped and named in `bad_lines`, so one damaged
    line does not hold back the others."""
    path = Path(path)
    run_file: RunFile | None = None
    for number, line in _lines(path):
        if run_file is None:
            if isinstance(line, str):
                raise RunFileError(f"{path}:{number}: {line}")
            ((kind, body),) = line.items()
            if kind != "run":
                raise RunFileError(f"{path}:{number}: the first line must be the run line, not {kind!r}")
            run_file = RunFile(path, body, [], number)
            continue
        problem = line if isinstance(line, str) else _record_line_problem(line)
        if problem is not None:
            run_file.bad_lines.append(f"{path}:{number}: {problem}")
            continue
        assert isinstance(line, dict)
        run_file.records.append(line["record"])
        run_file.record_lines.append(number)
    if run_file is None:
        raise RunFileError(f"{path}: empty: no run line")
    return run_file


def _record_line_problem(line: dict[str, Any]) -> str | None:
    ((kind, body),) = line.items()
    if kind == "run":
        return "a second run line (the run line comes first, once)"
    if kind != "record":
        return f'unknown line kind {kind!r} (expected "run" or "record")'
    for key in ("interval", "rank"):  # what the senders themselves need: the server checks the rest
        value = body.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            return f"a record needs an integer {key!r}, got {value!r}"
    return None
