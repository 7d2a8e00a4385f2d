"""The baseline's over-count in the gallery's runs, as docs/gallery.md's table and the README give
it, recomputed from the run files with the catalogue's formulas over the window the dashboard
shows (`steady`: every interval after the first)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from packscope.core.catalogue import FIELDS, Coefficients, derive, sums_of_rows
from packscope.core.run_file import RunFile, read_run_file
from packscope.gallery import run_files

ROOT = Path(__file__).resolve().parents[1]
START, END = "<!-- gallery:overcount -->\n", "<!-- /gallery:overcount -->"


def fields_of(record: dict[str, Any]) -> dict[str, Any]:
    """A wire record's scalar fields by catalogue name, absent ones as the server stores them."""
    out = {}
    for f in FIELDS:
        value: Any = record
        for key in f.wire_path:
            value = value.get(key) if isinstance(value, dict) else None
        out[f.name] = f.default if value is None and f.default is not None else value
    return out


def steady_overcount(run: RunFile) -> float:
    rows = [fields_of(record) for record in run.records]
    first = min(row["interval"] for row in rows)
    sums = sums_of_rows(row for row in rows if row["interval"] != first)
    return derive(sums, Coefficients.for_run(run.run["model"], run.run["hardware"]), ["overcount_pct"])["overcount_pct"]


def gallery() -> dict[str, dict[str, RunFile]]:
    """The gallery's runs by pair, then by side (before, after)."""
    pairs: dict[str, dict[str, RunFile]] = {}
    for path in run_files():
        run = read_run_file(path)
        tags = run.run["tags"]
        (pair,) = (tag.removeprefix("pair:") for tag in tags if tag.startswith("pair:"))
        (side,) = (tag for tag in tags if tag in ("before", "after"))
        pairs.setdefault(pair, {})[side] = run
    return dict(sorted(pairs.items()))


def overcount_table() -> str:
    lines = ["| pair | preset | a step (packs × pack length) | over-count, before | after |", "|---|---|---|---|---|"]
    for pair, sides in gallery().items():
        config = sides["before"].run["config"]
        before, after = (f"{steady_overcount(sides[side]):.1f}%" for side in ("before", "after"))
        step = f"{config['packs_per_step']} × {config['pack_length']}"
        lines.append(f"| `{pair}` | {config['preset']} | {step} | {before} | {after} |")
    return "\n".join(lines)


def test_the_gallery_docs_table_is_the_run_files():
    text = (ROOT / "docs" / "gallery.md").read_text()
    assert START in text and END in text, f"docs/gallery.md has no over-count table between {START.strip()} and {END}"
    shown = text[text.index(START) + len(START) : text.index(END)].strip()
    expected = overcount_table()
    assert shown == expected, "docs/gallery.md's over-count table is stale; put this there:\n" + expected


def test_the_readme_gives_the_gallerys_range_of_over_counts():
    values = [steady_overcount(run) for sides in gallery().values() for run in sides.values()]
    readme = " ".join((ROOT / "README.md").read_text().split())  # lines joined
    claims = re.findall(r"by (\d+\.\d)% to (\d+\.\d)% in the gallery", readme)
    assert claims == [(f"{min(values):.1f}", f"{max(values):.1f}")]
