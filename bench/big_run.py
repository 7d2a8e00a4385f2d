"""A long run for the read and live benchmarks, built once in a database that is kept between
sittings (building a 1M-interval run takes minutes on 2 cores).

    python bench/big_run.py --database-url sqlite:////tmp/psbench/1m.db --intervals 1000000

Stores run `big-N` (N intervals of one rank, 64 distinct records re-numbered) unless the
database already holds it with N rows; prints one JSON object.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from bench_data import record, run_body
from sqlalchemy import select

from packscope.backend.api.schemas import RunCreate
from packscope.backend.ingest.batches import create_or_resume_run, ingest_batch
from packscope.backend.store.db import make_engine, make_sessionmaker, upgrade_schema
from packscope.backend.store.models import run_totals
from packscope.backend.store.runs import get_run


def ensure_big_run(database_url: str, intervals: int) -> dict[str, Any]:
    """The run `big-<intervals>` stored in `database_url` with that many intervals."""
    run_id = f"big-{intervals}"
    engine = make_engine(database_url)
    upgrade_schema(engine)
    make_session = make_sessionmaker(engine)
    t0 = time.perf_counter()
    with make_session() as session:
        run = get_run(session, run_id)
        if run is None:
            run, _ = create_or_resume_run(session, RunCreate.model_validate(run_body(run_id)))
        stored = session.scalar(select(run_totals.c.rows).where(run_totals.c.run_pk == run.id)) or 0
        rng = random.Random(run_id)
        template = [record(i, 0, rng) for i in range(64)]
        for start in range(stored, intervals, 1000):
            batch = [
                {**template[i % 64], "interval": i, "first_step": i * 10 + 1, "last_step": i * 10 + 10}
                for i in range(start, min(start + 1000, intervals))
            ]
            ingest_batch(session, run, batch)
    engine.dispose()
    return {"run_id": run_id, "intervals": intervals, "built_s": time.perf_counter() - t0, "had": stored}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--database-url", required=True)
    ap.add_argument("--intervals", type=int, default=1_000_000)
    args = ap.parse_args()
    print(json.dumps(ensure_big_run(args.database_url, args.intervals)))


if __name__ == "__main__":
    main()
