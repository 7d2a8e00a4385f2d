"""GET /api/v1/runs/{id}/ranks against the run's length: the handler's time on runs of 10k, 100k
and 1M intervals, with the interval range found the way it was before 2026-12-01 (one
min()/max() over the run's rows) and as now (index seeks, series.interval_range), alternated in
one sitting so that the machine's load weighs on both alike.

    python bench/ranks_scale.py --database-url sqlite:////tmp/psbench/1m.db --intervals 10000,100000,1000000

The runs are built once by bench/big_run.py and kept in that database. Prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from big_run import ensure_big_run
from sqlalchemy import func, select

from packscope.backend.reads import ranks
from packscope.backend.store.db import make_engine, make_sessionmaker
from packscope.backend.store.models import intervals
from packscope.backend.store.runs import get_run


def span_before(session: Any, run: Any, step_min: int | None, step_max: int | None) -> tuple[int, int] | None:
    """The range as ranks.py found it until 2026-12-01: min and max in one statement, which SQLite
    answers by walking every row of the run."""
    query = select(func.min(intervals.c.interval), func.max(intervals.c.interval)).where(intervals.c.run_pk == run.id)
    if step_min is not None:
        query = query.where(intervals.c.last_step >= step_min)
    if step_max is not None:
        query = query.where(intervals.c.first_step <= step_max)
    first, last = session.execute(query).one()
    return None if first is None else (int(first), int(last))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database-url", required=True)
    ap.add_argument("--intervals", default="10000,100000,1000000")
    ap.add_argument("--repeat", type=int, default=15)
    args = ap.parse_args()
    sizes = [int(x) for x in args.intervals.split(",")]
    for n in sizes:
        ensure_big_run(args.database_url, n)
    engine = make_engine(args.database_url)
    make_session = make_sessionmaker(engine)
    now = ranks.interval_range
    out: dict[str, Any] = {"database": engine.dialect.name, "cpus": os.cpu_count(), "load_avg": os.getloadavg()}
    rows = []
    for n in sizes:
        with make_session() as session:
            run = get_run(session, f"big-{n}")
            assert run is not None
            times: dict[str, list[float]] = {"before": [], "after": []}
            for _ in range(args.repeat):
                for name, span in (("before", span_before), ("after", now)):
                    ranks.interval_range = span
                    for step_min in (None, n * 5):  # the whole run, and its second half (a zoom)
                        t0 = time.perf_counter()
                        ranks.rank_step_times(session, run, 200, step_min, None)
                        times[name].append((time.perf_counter() - t0) * 1e3)
            ranks.interval_range = now
            rows.append(
                {
                    "intervals": n,
                    **{f"{k}_ms_p50": statistics.median(v) for k, v in times.items()},
                    "before_over_after": statistics.median(times["before"]) / statistics.median(times["after"]),
                }
            )
    out["runs"] = rows
    out["load_avg_end"] = os.getloadavg()
    engine.dispose()
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
