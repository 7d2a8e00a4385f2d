"""docs/BENCHMARKS.md stays a page one can read at a glance (its sessions live in the log,
docs/benchmarks/), and every link into either lands on an anchor that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "docs" / "BENCHMARKS.md"
LOG = ROOT / "docs" / "benchmarks"
MAX_LINES = 150
MAX_ROW = 200

# A markdown link's target (inline or a reference definition) and a path written in a comment.
MD_TARGET = re.compile(r"\]\(([^)\s]+)\)|^\[[^\]]+\]:\s*(\S+)", re.M)
WRITTEN = re.compile(r"(docs/(?:BENCHMARKS\.md|benchmarks/[\w-]+\.md)#[\w-]+)")
SOURCES = ("*.md", "*.py", "*.js", "*.sh", "*.toml", "*.html")


def _anchors(path: Path) -> set[str]:
    text = path.read_text(encoding="utf-8")
    ids = set(re.findall(r'<a id="([\w-]+)"></a>', text))
    slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, re.M)}
    return ids | slugs


def _table_rows(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("|")]


def test_the_dashboard_is_short():
    lines = DASHBOARD.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"docs/BENCHMARKS.md has {len(lines)} lines; sessions belong in docs/benchmarks/"


def test_the_dashboards_rows_are_short():
    long_rows = [row[:80] for row in _table_rows(DASHBOARD.read_text(encoding="utf-8")) if len(row) > MAX_ROW]
    assert not long_rows, f"rows over {MAX_ROW} characters (details belong in the log): {long_rows}"


def test_every_goal_row_says_whether_it_is_met_and_links_its_session():
    text = DASHBOARD.read_text(encoding="utf-8")
    goals = text.split("## Goals", 1)[1].split("\n## ", 1)[0]
    header, _, *rows = _table_rows(goals)
    assert [c.strip() for c in header.strip("|").split("|")] == [
        "goal", "latest figure", "met", "machine", "date", "commit", "command", "log",
    ]  # fmt: skip
    assert rows, "the Goals table has no rows"
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert re.match(r"(yes|no)\b", cells[2]), f"met is neither yes nor no: {row[:80]}"
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}", cells[4]), f"not a date: {row[:80]}"
        assert cells[7].startswith("[log]"), f"no link to its session: {row[:80]}"


def test_every_link_into_the_benchmarks_lands_on_an_anchor():
    docs = [DASHBOARD, *LOG.glob("*.md")]
    broken = []
    for doc in docs:
        for inline, reference in MD_TARGET.findall(doc.read_text(encoding="utf-8")):
            target = inline or reference
            if target.startswith(("http:", "https:")):
                continue
            file_part, _, anchor = target.partition("#")
            path = (doc.parent / file_part).resolve() if file_part else doc
            if not path.exists() or (anchor and anchor not in _anchors(path)):
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    for pattern in SOURCES:
        for path in ROOT.rglob(pattern):
            parts = path.relative_to(ROOT).parts
            # The environments (.venv, and make test's .venv-torchtitan and .venv-timm: a torch each).
            if {"node_modules", ".git"} & set(parts) or any(part.startswith(".venv") for part in parts):
                continue
            for written in WRITTEN.findall(path.read_text(encoding="utf-8", errors="replace")):
                file_part, _, anchor = written.partition("#")
                if not (ROOT / file_part).exists() or anchor not in _anchors(ROOT / file_part):
                    broken.append(f"{path.relative_to(ROOT)}: {written}")
    assert not broken, sorted(set(broken))


def test_the_logs_index_lists_every_session_file():
    index = (LOG / "README.md").read_text(encoding="utf-8")
    unlisted = [p.name for p in LOG.glob("*.md") if p.name != "README.md" and f"]({p.name})" not in index]
    assert not unlisted, f"docs/benchmarks/README.md does not list {unlisted}"
