"""A run's largest loss for the runs list (docs/ledger.md, "In the runs list"): the ledger's
largest priced term that a change to the loop removes, from the run-level sums the list already
reads, so a page of runs costs no query more. Stragglers need each rank's sums, which the run
totals do not hold: the list leaves them out (the run page's ledger has them)."""

from collections.abc import Mapping
from typing import Any

from packscope.core import ledger
from packscope.core.catalogue import Coefficients

# What the kernels leave is no setting of the loop: the list names what a change removes.
_NOT_A_FIX = frozenset({"remainder"})


def largest_loss(sums: Mapping[str, float], c: Coefficients, layout: str | None) -> dict[str, Any] | None:
    """The largest loss above 0 with a value, as the ledger prices it (name, label, percent and
    ms of the step, its fix), or None where no such loss was measured."""
    terms = ledger.ledger_terms(sums, c, layout, ledger.NO_RANK_WAITS, ())
    step_s = ledger.step_time_s(sums, c)
    priced = [t for t in terms if t.loss and t.name not in _NOT_A_FIX and t.fraction is not None and t.fraction > 0]
    if not priced or step_s is None:
        return None
    top = max(priced, key=lambda t: t.fraction or 0.0)
    shown = ledger.as_time(top, step_s, sums["gpu_seconds"])
    return {
        "name": top.name,
        "label": top.label,
        "pct_of_step": shown["pct_of_step"],
        "ms_per_step": shown["ms_per_step"],
        "status": top.status,
        "fix": top.fix,
    }
