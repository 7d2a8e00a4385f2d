"""Syncs per step from wire records, as the benchmarks read them: over the counted steps only."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))  # the benchmarks import it as a sibling
from sync_records import counted_steps, sync_sites, syncs_per_step


def record(steps, total, uncounted=None, sites=()):
    syncs = {"total": total, "sites": [{"site": s, "count": n} for s, n in sites]}
    if uncounted is not None:
        syncs["uncounted_steps"] = uncounted
    return {"steps": steps, "syncs": syncs}


def test_uncounted_steps_are_left_out_of_the_steps_syncs_divide_by():
    records = [
        record(10, 30, sites=[("a.py:1", 20), ("b.py:2", 10)]),  # an agent before sampling: no field
        record(10, 0, uncounted=10),
        record(5, 5, uncounted=0, sites=[("a.py:1", 5)]),
    ]
    assert counted_steps(records) == 15
    assert syncs_per_step(records) == 35 / 15
    assert sync_sites(records) == {"a.py:1": 25, "b.py:2": 10}


def test_no_counted_step_has_no_rate():
    assert syncs_per_step([record(10, 0, uncounted=10)]) is None
    assert syncs_per_step([]) is None
