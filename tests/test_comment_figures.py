"""Product code's comments and docstrings carry no measured times: a figure goes stale when the
machine or the code changes, so a comment points to the benchmark log (docs/benchmarks/) that
holds it instead. A time that is a setting (a timeout, a period, a default) may be written."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("agent", "backend", "packscope", "trainer", "frontend")
NOT_OURS = ("frontend/vendor/",)  # plotly.js's bundle, committed as npm ships it
FIGURE = re.compile(
    r"(?<![\w.])\d+(?:[.,]\d+)*(?:\s*[-–]\s*\d+(?:[.,]\d+)*)?\s*"
    r"(?:µs|us|ns|ms|s|secs?|seconds?|min|minutes?|microseconds?|milliseconds?|nanoseconds?)\b"
)
JS_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/|<!--.*?-->", re.S)
# Times that are settings or examples of a format, not measurements, by file.
SETTINGS = {
    "packscope/commands/importer.py": {"2 s", "60 s"},  # the sender's backoff defaults
    "packscope/core/spool.py": {"10 min"},  # the set-aside records' retry ages
    "trainer/train.py": {"30 s"},  # the agent's default close timeout, not waited for
    "frontend/static/run_early.js": {"100 ms"},  # the fallback timer of a hidden tab
    "frontend/static/runs.js": {"5 s"},  # the runs page's refresh period
    "frontend/static/format.js": {"0.05000 s"},  # an example of the format
    "frontend/static/run_facts.js": {"4 min"},  # an example of the format
}


def _python_prose(text: str) -> list[str]:
    comments = [t.string for t in tokenize.generate_tokens(io.StringIO(text).readline) if t.type == tokenize.COMMENT]
    documented = (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    docstrings = [ast.get_docstring(n, clean=False) for n in ast.walk(ast.parse(text)) if isinstance(n, documented)]
    return comments + [d for d in docstrings if d]


def product_prose() -> dict[str, list[str]]:
    """Each product module's comments and docstrings."""
    out = {}
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*")):
            if "__pycache__" in path.parts or not path.is_file():
                continue
            if path.relative_to(ROOT).as_posix().startswith(NOT_OURS):
                continue
            text = path.read_text(encoding="utf-8")
            if path.suffix == ".py":
                out[path.relative_to(ROOT).as_posix()] = _python_prose(text)
            elif path.suffix in (".js", ".css", ".html"):
                out[path.relative_to(ROOT).as_posix()] = JS_COMMENT.findall(text)
    return out


def _figures() -> dict[str, list[str]]:
    return {name: [m.group() for c in prose for m in FIGURE.finditer(c)] for name, prose in product_prose().items()}


def test_no_product_comment_carries_a_measured_time():
    measured = {
        f"{name}: {figure}"
        for name, figures in _figures().items()
        for figure in figures
        if figure not in SETTINGS.get(name, set())
    }
    assert not measured, f"point to docs/benchmarks/ instead of: {sorted(measured)}"


def test_every_allowed_setting_is_still_written():
    figures = _figures()
    gone = {f"{name}: {s}" for name, allowed in SETTINGS.items() for s in allowed if s not in figures.get(name, [])}
    assert not gone, f"drop these from SETTINGS: {sorted(gone)}"


def test_the_figure_pattern_tells_a_measurement_from_a_name():
    found = [m.group() for m in FIGURE.finditer("cost 30-50 µs, 1.5 ms, 9–33 s; float64s, x2s, 3 sums")]
    assert found == ["30-50 µs", "1.5 ms", "9–33 s"]
