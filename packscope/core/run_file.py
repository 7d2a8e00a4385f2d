"""A run as a file: what the agent would have sent to a server, kept as JSON lines.

    {"run": {...}}        first line: the run's registration body (POST /api/v1/runs)
    {"record": {...}}     then one line per interval record (POST /api/v1/runs/{id}/intervals)

One file per rank; the files of one run share the run line's run_id, and the server sums the
ranks as it does live. Written by `packscope train --records-dir`, read by `packscope import`
(and the demo's gallery of GPU runs). Torch-free, so the importer runs anywhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class RunFileError(ValueError):
    """A line that is not what the format says, named by file and line number."""


@dataclass
class RunFile:
    path: Path
    run: dict[str, Any]
    records: list[dict[str, Any]]


def write_run_file(path: str | Path, run: dict[str, Any], records: Iterable[dict[str, Any]]) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps({"run": run}, default=str)]
    lines += [json.dumps({"record": record}) for record in records]
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("\n".join(lines) + "\n")
    tmp.replace(path)  # never a half-written file under the final name
    return path


def _lines(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    with path.open(encoding="utf-8") as f:
        for number, text in enumerate(f, start=1):
            if not text.strip():
                continue
            try:
                value = json.loads(text)
            except json.JSONDecodeError as err:
                raise RunFileError(f"{path}:{number}: not JSON ({err.msg})") from None
            if not (isinstance(value, dict) and len(value) == 1 and isinstance(next(iter(value.values())), dict)):
                raise RunFileError(f'{path}:{number}: expected {{"run": {{...}}}} or {{"record": {{...}}}}')
            yield number, value


def read_run_file(path: str | Path) -> RunFile:
    """The run line and every record line; the server validates their contents."""
    path = Path(path)
    run: dict[str, Any] | None = None
    records: list[dict[str, Any]] = []
    for number, line in _lines(path):
        ((kind, body),) = line.items()
        if kind == "run":
            if run is not None or records:
                raise RunFileError(f"{path}:{number}: the run line must come first, once")
            run = body
        elif kind == "record":
            if run is None:
                raise RunFileError(f"{path}:{number}: a record before the run line")
            records.append(body)
        else:
            raise RunFileError(f'{path}:{number}: unknown line kind {kind!r} (expected "run" or "record")')
    if run is None:
        raise RunFileError(f"{path}: empty: no run line")
    return RunFile(path, run, records)
