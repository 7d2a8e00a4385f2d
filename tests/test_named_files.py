"""The files that docs and comments name exist: a path of the repository's folders
(`backend/store/models.py`) wherever it is written, and a bare module name (`run_early.js`) where
the pages' own modules are meant."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FOLDERS = [
    "agent",
    "alembic",
    "backend",
    "bench",
    "docs",
    "examples",
    "frontend",
    "gallery",
    "packscope",
    "tests",
    "trainer",
]
TOP_FILES = ("README.md", "Makefile", "Dockerfile", "docker-compose.yml", "pyproject.toml", ".ci/run")
SUFFIXES = {".py", ".js", ".html", ".md", ".sh", ".toml", ".yml", ".txt"}
# Not held to today's tree: the benchmarks' log names the files a session measured, as they were
# then; the packaging test names paths inside an installed wheel.
AS_THEY_WERE = ("docs/benchmarks/", "tests/packaging/test_packaging.py")
NOT_OURS = ("frontend/vendor/",)  # plotly.js's bundle, committed as npm ships it

PATH = re.compile(
    r"(?<![\w./-])((?:" + "|".join(FOLDERS) + r")/[\w./-]*\w\.(?:py|js|md|sh|json|jsonl|html|css|txt|toml))\b(?![/\w])"
)
JS_MODULE = re.compile(r"(?<![\w./-])(\w+\.js)\b")
NOT_OURS_JS = {"plotly.js"}  # the charting library, its bundle served from frontend/vendor/


def texts() -> dict[str, str]:
    files = [ROOT / name for name in TOP_FILES if (ROOT / name).exists()]
    for folder in FOLDERS:
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in SUFFIXES and "__pycache__" not in p.parts]
    out = {}
    for path in files:
        name = path.relative_to(ROOT).as_posix()
        if not name.startswith(AS_THEY_WERE + NOT_OURS) and path.is_file():
            out[name] = path.read_text(encoding="utf-8")
    return out


def test_every_named_repository_path_exists():
    missing = {
        f"{name}: {path}" for name, text in texts().items() for path in PATH.findall(text) if not (ROOT / path).exists()
    }
    assert not missing, sorted(missing)


def test_every_named_page_module_exists():
    modules = {p.name for p in (ROOT / "frontend" / "static").glob("*.js")} | NOT_OURS_JS
    pages = {name: text for name, text in texts().items() if name.startswith(("frontend/", "docs/"))}
    missing = {
        f"{name}: {module}"
        for name, text in pages.items()
        for module in JS_MODULE.findall(text)
        if module not in modules
    }
    assert not missing, sorted(missing)
