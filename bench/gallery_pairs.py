"""Before/after step-time differences of the gallery's pairs, from the run files themselves.

For each `pair:<name>` (one `before` and one `after` run file), the per-interval step time
(gpu_time_s / steps, first interval dropped: allocation, compile, capture) of each run; the
difference of the means after minus before, relative to before, with a 95% percentile-bootstrap
interval (intervals resampled within each run), syncs per iteration of each, and the time between steps per
gap: the data wait and the part of it a host sync began (`sync_idle_between_s` over the traced
gaps; null in files recorded before the agent sent it), and the host's time blocked in syncs per
traced step (`sync_blocked_s`; null likewise). Prints JSON.

    python bench/gallery_pairs.py [gallery/*.jsonl]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
from pathlib import Path

from sync_records import syncs_per_step

from packscope.core.run_file import read_run_file


def step_times(records: list[dict]) -> list[float]:
    ordered = sorted(records, key=lambda r: r["interval"])[1:]
    return [r["gpu_time_s"] / r["steps"] for r in ordered]


def syncs_per_iter(records: list[dict]) -> float | None:
    return syncs_per_step(sorted(records, key=lambda r: r["interval"])[1:])


def per_gap_ms(records: list[dict], idle: str, gaps: str) -> float | None:
    """Σ idle ÷ Σ gaps in ms over the steady intervals that carry both, or None."""
    carrying = [r for r in sorted(records, key=lambda r: r["interval"])[1:] if r.get(idle) is not None and r.get(gaps)]
    return 1e3 * sum(r[idle] for r in carrying) / sum(r[gaps] for r in carrying) if carrying else None


def relative_change(before: list[float], after: list[float], resamples: int = 4000, seed: int = 0) -> dict:
    rng = random.Random(seed)
    point = statistics.fmean(after) / statistics.fmean(before) - 1
    draws = sorted(
        statistics.fmean(rng.choices(after, k=len(after))) / statistics.fmean(rng.choices(before, k=len(before))) - 1
        for _ in range(resamples)
    )
    lo = int(0.025 * resamples)
    return {"relative": point, "ci95": [draws[lo], draws[resamples - 1 - lo]]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    default = sorted(str(p) for p in Path(__file__).resolve().parents[1].joinpath("gallery").glob("*.jsonl"))
    ap.add_argument("files", nargs="*", default=default)
    args = ap.parse_args()
    pairs: dict[str, dict[str, list[dict]]] = {}
    for path in args.files:
        run = read_run_file(path)
        tags = run.run.get("tags", [])
        name = next((t.removeprefix("pair:") for t in tags if t.startswith("pair:")), None)
        role = "before" if "before" in tags else "after" if "after" in tags else None
        round_ = next((t.removeprefix("round:") for t in tags if t.startswith("round:")), None)
        if name and role:  # a pair recorded in rounds (fixes_runs.py --rounds): each round apart
            pairs.setdefault(f"{name} round {round_}" if round_ else name, {})[role] = run.records
    out = {}
    for name, runs in sorted(pairs.items()):
        if set(runs) != {"before", "after"}:
            print(f"gallery_pairs: {name} lacks a before or an after", file=sys.stderr)
            continue
        before, after = step_times(runs["before"]), step_times(runs["after"])
        out[name] = {
            "step_time_s": {"before": statistics.fmean(before), "after": statistics.fmean(after)},
            "intervals": {"before": len(before), "after": len(after)},
            "step_time_change": relative_change(before, after),
            "syncs_per_iter": {"before": syncs_per_iter(runs["before"]), "after": syncs_per_iter(runs["after"])},
            "data_wait_ms_per_gap": {role: per_gap_ms(runs[role], "data_wait_s", "data_wait_gaps") for role in runs},
            "sync_idle_between_ms_per_gap": {
                role: per_gap_ms(runs[role], "sync_idle_between_s", "traced_gaps") for role in runs
            },
            # The host's time blocked in syncs, per traced step (the cap on the syncs' time).
            "sync_blocked_ms_per_step": {
                role: per_gap_ms(runs[role], "sync_blocked_s", "traced_steps") for role in runs
            },
        }
    print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
