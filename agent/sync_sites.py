"""The code line a host sync is charged to: the first stack frame outside torch, the agent and the
warnings module, as ``path:line in function``.

The path says which file without doubt, yet stays short: a library's file (site-packages, the
standard library) by its import path (``transformers/trainer.py``), a file under the working
directory relative to it (``trainer/legacy_logging.py``), any other by its absolute path. A
site longer than the server stores (``MAX_SITE_LENGTH``) keeps its tail, where the file name,
the line and the function are.
"""

from __future__ import annotations

import functools
import os
import site
import sys
import sysconfig
import warnings

import torch

from packscope.core.catalogue import MAX_SITE_LENGTH

# Skipped: torch, the agent and the warnings module (its frames stand between a flagged sync and
# the counter's handler); the rest of the standard library is code like any other.
_SKIPPED = (os.path.dirname(torch.__file__) + os.sep, os.path.dirname(__file__) + os.sep, warnings.__file__)

# Per source file: its shown path, or None for a file whose frames are skipped. A trainer that
# syncs a hundred times a step pays this walk a hundred times: each file is judged once.
_FILE_PATH: dict[str, str | None] = {}


@functools.cache
def _library_roots() -> tuple[str, ...]:
    """Where installed libraries and the standard library live, longest first."""
    paths = sysconfig.get_paths()
    roots = {paths[key] for key in ("purelib", "platlib", "stdlib", "platstdlib") if key in paths}
    roots.update(site.getsitepackages())
    roots.add(site.getusersitepackages())
    return tuple(sorted((os.path.normpath(r) + os.sep for r in roots), key=len, reverse=True))


def shown_path(filename: str) -> str:
    """A source file as a site names it."""
    if not os.path.isabs(filename):  # "<string>", "<stdin>", a relative path of a script run as such
        return filename
    path = os.path.normpath(filename)
    root = next((r for r in _library_roots() if path.startswith(r)), None)
    if root is None and path.startswith(cwd := os.path.join(os.getcwd(), "")):
        root = cwd
    shown = path[len(root) :] if root else path
    return shown.encode("utf-8", "backslashreplace").decode("utf-8")  # a byte a file name may hold, as text


def _judge(filename: str) -> str | None:
    skipped = filename.startswith(_SKIPPED) or filename.startswith("<frozen")
    path = _FILE_PATH[filename] = None if skipped else shown_path(filename)
    return path


def caller_site(frame=None) -> str:
    """``path:line in function`` of the first frame outside torch, the agent and the warnings module."""
    f = frame or sys._getframe(1)
    while f is not None:
        code = f.f_code
        filename = code.co_filename
        path = _FILE_PATH[filename] if filename in _FILE_PATH else _judge(filename)
        if path is not None:
            site = f"{path}:{f.f_lineno} in {code.co_qualname}"
            return site if len(site) <= MAX_SITE_LENGTH else "…" + site[1 - MAX_SITE_LENGTH :]
        f = f.f_back
    return "<unknown>"
