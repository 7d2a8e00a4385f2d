"""What the runs list's largest-loss column adds (docs/ledger.md, "In the runs list"): per run,
`largest_loss` beside `derive` (every metric of the run, which each listed run's summary already
computes twice, totals and steady), over the sums of 10,000 runs held in memory. A page of the
list computes it for its runs only (50 by default), and sorting never does, so the cost at 10,000
runs is the page's, not the store's.

    python bench/largest_loss.py [--runs 10000] [--repeat 5]

Prints one JSON object: µs per run of each, best of the repeats, and their ratio (same sitting).
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from bench_data import MODEL, record

from packscope.core.catalogue import FIELDS, Coefficients, derive, sums_of_rows
from packscope.core.largest_loss import largest_loss


def fields_of(wire: dict) -> dict:
    """A wire record's catalogue fields by name (each at its wire path, else its default)."""
    out = {}
    for f in FIELDS:
        value: Any = wire
        for part in f.wire_path:
            value = value.get(part) if isinstance(value, dict) else None
        out[f.name] = f.default if value is None else value
    return out


def run_sums(rng: random.Random) -> dict[str, float]:
    """A run's sums: four intervals of bench_data's records."""
    return sums_of_rows(fields_of(record(k, 0, rng)) for k in range(4))


def best_us(work, items, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        for item in items:
            work(item)
        times.append(time.perf_counter() - start)
    return min(times) / len(items) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=10_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    rng = random.Random(0)
    c = Coefficients.for_run(MODEL, {"peak_tflops": 989.0})
    runs = [run_sums(rng) for _ in range(args.runs)]
    derive_us = best_us(lambda s: derive(s, c), runs, args.repeat)
    loss_us = best_us(lambda s: largest_loss(s, c, "thd"), runs, args.repeat)
    named = sum(largest_loss(s, c, "thd") is not None for s in runs[:100])
    print(json.dumps({
        "runs": args.runs,
        "derive_us_per_run": round(derive_us, 2),
        "largest_loss_us_per_run": round(loss_us, 2),
        "largest_loss_over_derive": round(loss_us / derive_us, 3),
        "page_of_50_ms": round(50 * loss_us / 1e3, 3),
        "all_runs_ms": round(args.runs * loss_us / 1e3, 1),
        "named_of_first_100": named,
    }))  # fmt: skip


if __name__ == "__main__":
    main()
