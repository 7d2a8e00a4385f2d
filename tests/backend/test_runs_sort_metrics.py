"""The runs list sorted by every derived catalogue metric (reads/runs_list.py: the sums as numpy
columns, one evaluation per distinct model) against the order of that metric as each run's own
summary derives it in Python (steady once the run has it, else totals; amounts from the totals):
two models, two ranks a run, runs without intervals, and a run stored before migration 0016
(its first interval marked, summed from its rows)."""

import random
from typing import Any

import pytest
from sqlalchemy import text

from packscope.backend.reads.runs_list import DERIVED_SORT_KEYS
from packscope.backend.store.db import make_engine
from packscope.core.catalogue import METRIC

RUNS = "/api/v1/runs"


@pytest.fixture
def many(make_client, database_url, new_run, records):
    client = make_client(database_url)
    rng = random.Random(11)
    for i in range(24):
        body = new_run(f"r{i:02d}", started_at=f"2026-11-29T{i:02d}:00:00Z")
        if i % 3 == 0:  # a second model: other coefficients
            body["model"] = {**body["model"], "layers": 8, "hidden": 512}
        assert client.post(RUNS, json=body).status_code == 201
        if i % 7 == 6:
            continue  # no interval yet
        n = rng.randint(1, 4)
        recs = [r for rank in range(2) for r in records(n, seed=i * 10 + rank, rank=rank, gpus=1, steps=5 + i % 4)]
        client.post(f"{RUNS}/r{i:02d}/intervals", json={"intervals": recs}).raise_for_status()
    engine = make_engine(database_url)
    try:
        with engine.begin() as connection:  # as migration 0016 leaves a run stored before it
            connection.execute(
                text(
                    "UPDATE run_first_interval SET rows = -1 WHERE run_pk = (SELECT id FROM runs WHERE run_id = 'r04')"
                )
            )
    finally:
        engine.dispose()
    return client


def shown(summary: dict[str, Any], key: str) -> float | None:
    window = summary["totals"] if METRIC[key].amount else (summary["steady"] or summary["totals"])
    return None if window is None else window[key]


def test_every_metric_sorts_as_the_summaries_derive_it(many):
    summaries = {r["run_id"]: many.get(f"{RUNS}/{r['run_id']}").json() for r in many.get(RUNS).json()["runs"]}
    newest = sorted(summaries, key=lambda r: summaries[r]["started_at"], reverse=True)
    for key in DERIVED_SORT_KEYS:
        for descending in (False, True):
            got = [
                r["run_id"] for r in many.get(RUNS, params={"sort": ("-" if descending else "") + key}).json()["runs"]
            ]
            valued = [r for r in newest if shown(summaries[r], key) is not None]
            want = sorted(valued, key=lambda r: shown(summaries[r], key), reverse=descending)  # stable: newest first
            want += [r for r in newest if shown(summaries[r], key) is None]
            assert got == want, (key, descending)
