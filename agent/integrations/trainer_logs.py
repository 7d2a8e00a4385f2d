"""What the HF Trainer and Lightning callbacks add to the trainer's own logs (docs/agent.md,
"In the trainer's own logs"): useful TFLOP/s, useful MFU and the largest loss of the ledger,
over this rank's intervals whose records were emitted since the last log.

No host sync and no device work: the records are host dicts the agent already built (their
counts were copied to the host without a sync, agent.py), so this is Python arithmetic on
floats, through the catalogue's and the ledger's own formulas (packscope.core), at log
boundaries only.

The largest loss is the server's runs-list figure (packscope.core.largest_loss) on this rank's
sums: padding, host syncs, the time between steps and launch-bound steps, as far as the rank's
records measure them (the syncs' and launch-bound time need the CUPTI trace). Stragglers need
every rank's step times: the server's ledger has them.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

from packscope.core.catalogue import FIELDS, FLOAT_OPS, METRIC, Coefficients, sums_of_rows
from packscope.core.largest_loss import largest_loss

PREFIX = "packscope/"


def fields_of(record: Mapping[str, Any]) -> dict[str, Any]:
    """A wire record's catalogue fields by name: each read at its wire path, else its default."""
    out: dict[str, Any] = {}
    for f in FIELDS:
        value: Any = record
        for part in f.wire_path:
            value = value.get(part) if isinstance(value, Mapping) else None
        out[f.name] = f.default if value is None else value
    return out


def _finite(value: float) -> float | None:
    return value if math.isfinite(value) else None


def log_values(records: Iterable[Mapping[str, Any]], c: Coefficients, layout: str | None) -> dict[str, float]:
    """The keys the callbacks log, over `records` (this rank's, not refused); a value that is not
    measured (no peak: no MFU; no step timed) is left out, never logged as 0."""
    rows = [fields_of(r) for r in records if not r.get("refused")]
    if not rows:
        return {}
    sums = sums_of_rows(rows)
    out: dict[str, float] = {}
    for name in ("tflops_useful", "mfu_useful"):
        value = _finite(METRIC[name].formula(sums, c, FLOAT_OPS))
        if value is not None:
            out[PREFIX + name] = value
    top = largest_loss(sums, c, layout)
    if top is not None:  # the term's name in the key: a logger's values are numbers
        out[PREFIX + f"largest_loss_{top['name']}_pct"] = top["pct_of_step"]
    return out


class TrainerLogs:
    """The records emitted since the last log, as log values: `take()` at each log boundary."""

    def __init__(self, agent: Any) -> None:
        self.agent = agent
        self._coefficients = Coefficients.for_run(agent.model.to_dict(), agent.hardware)
        self._last: Mapping[str, Any] | None = None  # the newest record taken so far

    def _new_records(self) -> list[Mapping[str, Any]]:
        held = self.agent.records
        if not held or held[-1] is self._last:  # the usual case between intervals: O(1)
            return []
        records = list(held)
        if self._last is not None:
            for i in range(len(records) - 1, -1, -1):
                if records[i] is self._last:
                    records = records[i + 1 :]
                    break
        if records:
            self._last = records[-1]
        return records

    def take(self) -> dict[str, float]:
        """The values over the intervals emitted since the last call ({} where none was)."""
        return log_values(self._new_records(), self._coefficients, self.agent.layout_seen or self.agent.config.layout)
