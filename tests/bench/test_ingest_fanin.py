"""bench/ingest_fanin.py's smoke run: two server processes on a fresh PostgreSQL database, a few
open-loop connections for a second; every request is answered (200, or 503 where a loaded machine
made it shed one) and the database holds exactly the keys acknowledged, each once, and its totals
count each once."""

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

BENCH = Path(__file__).parents[2] / "bench"
sys.path.insert(0, str(BENCH))  # the benchmarks import it as a sibling
import fanin_generator  # noqa: E402


def test_a_body_is_its_template_with_the_key_filled_in():
    template = fanin_generator.Template(random.Random(3))
    batch = json.loads(template.body(interval=7, rank=16383))
    (one,) = batch["intervals"]
    assert (one["interval"], one["rank"], one["first_step"], one["last_step"]) == (7, 16383, 71, 80)
    assert one["steps"] == fanin_generator.STEPS


@pytest.mark.postgres
@pytest.mark.slow
def test_the_smoke_run_stores_what_it_acknowledged():
    try:
        psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres", connect_timeout=3).close()
    except psycopg.OperationalError as exc:
        if os.environ.get("CI"):  # as the postgres fixture: CI starts PostgreSQL, so its absence fails
            raise
        pytest.skip(f"PostgreSQL is not reachable on 127.0.0.1:5432 ({exc})")
    done = subprocess.run(
        [sys.executable, str(BENCH / "ingest_fanin.py"), "--smoke"], capture_output=True, text=True, timeout=240
    )
    assert done.returncode == 0, done.stderr[-3000:]
    (rate,) = json.loads(done.stdout)["rates"]
    assert rate["requests_offered"] == 40  # 40 req/s for 1 s, open loop
    statuses = rate["answered_by_status"]
    assert set(statuses) <= {"200", "503"} and sum(statuses.values()) == 40  # no request unanswered
    assert rate["acknowledged"] == statuses["200"] >= 1
    assert rate["acknowledged"] == rate["stored_rows"] == rate["run_totals_rows"]
    assert rate["stored_once"] and rate["acknowledged_not_stored"] == rate["stored_not_acknowledged"] == 0
    assert rate["stored_equals_acknowledged"]
    assert rate["latency_from_schedule_s"]["max"] is not None and rate["cpu_s"]["server"] > 0
