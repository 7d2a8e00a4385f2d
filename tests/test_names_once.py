"""What the catalogue builds on is spelled in one place: the name of an attention sum appears as a
string only in packscope/core/attention.py among the product's Python modules; the accumulator,
the catalogue and the calculator take it from there (ATTENTION_SUMS)."""

from __future__ import annotations

import ast
from pathlib import Path

from packscope.core.attention import SUM_NAMES

ROOT = Path(__file__).resolve().parents[1]
PRODUCT = ("agent", "backend", "packscope", "trainer")
HOME = "packscope/core/attention.py"


def string_constants(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    # An f-string's literal parts: f"seqlen_sq_sum_{view}" spells a name as much as the literal does.
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            found.add("".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values))
    return found


def spells(text: str, name: str) -> bool:
    """`text` is the name, or a template of it with the view left open ("seqlen_sq_sum_{}")."""
    return text in (name, name.rsplit("_", 1)[0] + "_{}")


def test_attention_sum_names_are_spelled_only_where_they_are_defined():
    restated = set()
    for folder in PRODUCT:
        for path in sorted((ROOT / folder).rglob("*.py")):
            name = path.relative_to(ROOT).as_posix()
            if name == HOME:
                continue
            for text in string_constants(path):
                restated |= {f"{name}: {text!r}" for sum_name in SUM_NAMES if spells(text, sum_name)}
    assert not restated, sorted(restated)
