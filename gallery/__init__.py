"""The gallery: run files recorded on a GPU (gallery/README.md), shipped in the wheel as
`packscope.gallery` so that `packscope demo` shows real numbers on its first screen. Data only;
`packscope.commands.importer` sends the files to a server."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

SUFFIX = ".jsonl"


def run_files(folder: str | Path | None = None) -> list[Path]:
    """The gallery's run files, sorted by name: the packaged ones, or the ones in `folder`.

    The package is installed as plain files (a wheel, or an editable checkout), so each entry is
    a path on disk that `packscope.core.run_file.read_run_file` can open.
    """
    if folder is not None:
        return sorted(p for p in Path(folder).iterdir() if p.name.endswith(SUFFIX) and p.is_file())
    entries = resources.files(__name__).iterdir()
    return sorted(Path(str(e)) for e in entries if e.name.endswith(SUFFIX) and e.is_file())
