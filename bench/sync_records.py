"""What interval records (docs/wire.md) say about host syncs, for the benchmarks that read records
themselves: torch-free. The server derives the same from its stored sums (the catalogue's
syncs_per_iter). Here, not in packscope, so that a `--code-root` run of an older packscope tree
(integration_overhead.py) still has it."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def counted_steps(records: Iterable[Mapping[str, Any]]) -> int:
    """The records' steps whose syncs were counted (the agent samples intervals: docs/agent.md)."""
    return sum(r["steps"] - r["syncs"].get("uncounted_steps", 0) for r in records)


def syncs_per_step(records: Sequence[Mapping[str, Any]]) -> float | None:
    """Syncs per counted step; None where no step was counted."""
    steps = counted_steps(records)
    return sum(r["syncs"]["total"] for r in records) / steps if steps else None


def sync_sites(records: Iterable[Mapping[str, Any]]) -> Counter[str]:
    """Every site's syncs over the records."""
    sites: Counter[str] = Counter()
    for r in records:
        for s in r["syncs"]["sites"]:
            sites[s["site"]] += s["count"]
    return sites
