"""The runs list sorted by every derived catalogue metric (reads/runs_list.py: in SQL, on the
values kept in run_metric_values, store/metric_values.py) against the order of that metric as
each run's own summary derives it in Python (steady once the run has it, else totals; amounts
from the totals): two models, two ranks a run, runs without intervals, runs without a reading
(no loss after the first interval: the steady loss is undefined; telemetry on some runs only),
and a run stored before migration 0016 (its first interval marked, summed from its rows) that
goes on receiving intervals. And the values kept: equal to the summaries' own, recomputed by the
first sort after a run's new intervals, rebuilt after an upgrade from before 0019 and recomputed
when the formulas that computed them changed."""

import random
from typing import Any

import pytest
from sqlalchemy import text

from packscope.backend.reads.runs_list import DERIVED_SORT_KEYS
from packscope.backend.store.db import make_engine, upgrade_schema
from packscope.backend.store.metric_values import refresh
from packscope.backend.store.models import KEPT_METRICS
from packscope.core.catalogue import METRIC
from tests.backend.migrating import downgrade

RUNS = "/api/v1/runs"


def _readings(recs: list[dict[str, Any]], i: int, rng: random.Random) -> list[dict[str, Any]]:
    for r in recs:
        if i % 4 == 1 and r["interval"] > 0:  # the loss of the first interval alone
            del r["loss"]
        if i % 5 == 2:
            r["gpu"] = {"util_pct": rng.uniform(20, 99), "power_w": rng.uniform(100, 700)}
    return recs


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
        client.post(f"{RUNS}/r{i:02d}/intervals", json={"intervals": _readings(recs, i, rng)}).raise_for_status()
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
    # Its later batch keeps its values from the first interval's rows, summed.
    later = [r for rank in range(2) for r in records(1, start=7, seed=90 + rank, rank=rank, gpus=1, steps=5)]
    client.post(f"{RUNS}/r04/intervals", json={"intervals": later}).raise_for_status()
    return client


def shown(summary: dict[str, Any], key: str) -> float | None:
    window = summary["totals"] if METRIC[key].amount else (summary["steady"] or summary["totals"])
    return None if window is None else window[key]


def summaries(client) -> dict[str, dict[str, Any]]:
    return {r["run_id"]: client.get(f"{RUNS}/{r['run_id']}").json() for r in client.get(RUNS).json()["runs"]}


def assert_sorted_as_the_summaries(client, summary: dict[str, dict[str, Any]]) -> None:
    newest = sorted(summary, key=lambda r: summary[r]["started_at"], reverse=True)
    for key in DERIVED_SORT_KEYS:
        for descending in (False, True):
            sort = ("-" if descending else "") + key
            got = [r["run_id"] for r in client.get(RUNS, params={"sort": sort}).json()["runs"]]
            valued = [r for r in newest if shown(summary[r], key) is not None]
            want = sorted(valued, key=lambda r: shown(summary[r], key), reverse=descending)  # stable: newest first
            want += [r for r in newest if shown(summary[r], key) is None]
            assert got == want, (key, descending)


def kept(database_url: str) -> dict[str, dict[str, Any]]:
    """run_id -> its run_metric_values row (formulas and every metric)."""
    engine = make_engine(database_url)
    try:
        with engine.connect() as connection:
            rows = connection.execute(
                text("SELECT r.run_id, v.* FROM run_metric_values v JOIN runs r ON r.id = v.run_pk")
            ).mappings()
            return {row["run_id"]: dict(row) for row in rows}
    finally:
        engine.dispose()


def test_every_metric_sorts_as_the_summaries_derive_it(many):
    summary = summaries(many)
    some = [key for key in ("loss", "gpu_util_pct") if len({shown(s, key) is None for s in summary.values()}) == 2]
    assert some == ["loss", "gpu_util_pct"]  # both with runs that have the value and runs that do not
    assert_sorted_as_the_summaries(many, summary)


def test_the_kept_values_are_the_summaries_own(many, database_url):
    assert kept(database_url) == {}  # ingest keeps none: the first metric sort computes them
    many.get(RUNS, params={"sort": "loss"}).raise_for_status()
    summary, values = summaries(many), kept(database_url)
    assert set(values) == {r for r, s in summary.items() if s["totals"] is not None}  # a row per run with totals
    for run_id, row in values.items():
        assert {key: row[key] for key in KEPT_METRICS} == {key: shown(summary[run_id], key) for key in KEPT_METRICS}


def test_a_sort_right_after_new_intervals_recomputes_those_runs(many, database_url, records):
    before = summaries(many)
    assert_sorted_as_the_summaries(many, before)  # every run's values computed
    for run_id, seed in (("r01", 71), ("r13", 72)):  # more intervals, other readings
        recs = [r for rank in range(2) for r in records(3, start=9, seed=seed + rank, rank=rank, gpus=2, steps=9)]
        many.post(f"{RUNS}/{run_id}/intervals", json={"intervals": recs}).raise_for_status()
    after = summaries(many)
    assert_sorted_as_the_summaries(many, after)
    values = kept(database_url)
    for run_id in ("r01", "r13"):
        assert {key: values[run_id][key] for key in KEPT_METRICS} == {
            key: shown(after[run_id], key) for key in KEPT_METRICS
        }
        assert shown(after[run_id], "tokens_per_gpu_s") != shown(before[run_id], "tokens_per_gpu_s")  # they changed
    moved = [
        k
        for k in DERIVED_SORT_KEYS
        if sorted(before, key=lambda r: shown(before[r], k) or 0)
        != sorted(after, key=lambda r: shown(after[r], k) or 0)
    ]
    assert moved  # and some order with them: stale values would have sorted wrong


def _set_up(database_url: str, sql: str) -> None:
    engine = make_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.execute(text(sql))
    finally:
        engine.dispose()


def test_an_upgrade_from_before_0019_computes_every_runs_values(many, database_url):
    many.get(RUNS, params={"sort": "loss"}).raise_for_status()  # every run's values computed
    before = kept(database_url)
    engine = make_engine(database_url)
    try:
        downgrade(engine, "0018")
        upgrade_schema(engine)
    finally:
        engine.dispose()
    assert kept(database_url) == before
    assert_sorted_as_the_summaries(many, summaries(many))


def test_values_of_other_formulas_are_recomputed_at_upgrade(many, database_url):
    many.get(RUNS, params={"sort": "loss"}).raise_for_status()  # every run's values computed
    before = kept(database_url)
    _set_up(database_url, "UPDATE run_metric_values SET formulas = 'older', tflops_thd = 1, loss = NULL")
    engine = make_engine(database_url)
    try:
        upgrade_schema(engine)
    finally:
        engine.dispose()
    assert kept(database_url) == before


# -- the mark: a sort rechecks only the runs whose totals were written since the last refresh -----
R02 = "(SELECT id FROM runs WHERE run_id = 'r02')"


def _refresh(database_url: str, everything: bool = False) -> int:
    engine = make_engine(database_url)
    try:
        return refresh(engine, everything)
    finally:
        engine.dispose()


def _mark(database_url: str) -> int:
    engine = make_engine(database_url)
    try:
        with engine.connect() as connection:
            return connection.execute(text("SELECT changed FROM run_metric_values_mark")).scalar_one()
    finally:
        engine.dispose()


def _stamps(database_url: str) -> dict[str, int]:
    engine = make_engine(database_url)
    try:
        with engine.connect() as connection:
            found = connection.execute(
                text("SELECT r.run_id, t.changed FROM run_totals t JOIN runs r ON r.id = t.run_pk")
            )
            return {run_id: changed for run_id, changed in found}  # noqa: C416
    finally:
        engine.dispose()


def test_every_write_of_a_runs_totals_raises_its_stamp_past_the_mark(many, database_url, records):
    assert _refresh(database_url) > 0  # every run's values computed, the mark set
    before = _stamps(database_url)
    mark = _mark(database_url)
    # (PostgreSQL's mark is the oldest transaction still running, in any database of the
    # server: it may lag behind the stamps of runs written before; never the other way.)
    recs = [r for rank in range(2) for r in records(1, start=20, seed=5 + rank, rank=rank, gpus=1, steps=5)]
    many.post(f"{RUNS}/r05/intervals", json={"intervals": recs}).raise_for_status()
    after = _stamps(database_url)
    assert after["r05"] >= mark and after["r05"] > before["r05"]
    assert {r: s for r, s in after.items() if r != "r05"} == {r: s for r, s in before.items() if r != "r05"}
    assert _refresh(database_url) == 1  # r05 alone, found on the stamp's index
    assert _refresh(database_url) == 0


def test_a_sort_rechecks_only_the_runs_written_since_the_mark(many, database_url, records):
    many.get(RUNS, params={"sort": "loss"}).raise_for_status()  # every run's values computed
    before = kept(database_url)
    # r02's values made stale behind its totals' back, its stamp that of a run written long before
    # the mark (PostgreSQL's trigger set aside for it): a sort does not read its row...
    stamp = f"UPDATE run_totals SET changed = 0 WHERE run_pk = {R02}"
    if database_url.startswith("postgresql"):
        stamp = f"ALTER TABLE run_totals DISABLE TRIGGER run_totals_stamp; {stamp}; "
        stamp += "ALTER TABLE run_totals ENABLE TRIGGER run_totals_stamp"
    for sql in (*stamp.split("; "), f'UPDATE run_metric_values SET "rows" = 1, loss = -1 WHERE run_pk = {R02}'):
        _set_up(database_url, sql)
    recs = [r for rank in range(2) for r in records(1, start=20, seed=7 + rank, rank=rank, gpus=1, steps=5)]
    many.post(f"{RUNS}/r05/intervals", json={"intervals": recs}).raise_for_status()
    many.get(RUNS, params={"sort": "loss"}).raise_for_status()
    values = kept(database_url)
    assert (values["r02"]["rows"], values["r02"]["loss"]) == (1, -1)
    assert values["r05"]["rows"] > before["r05"]["rows"]  # ...while the run written since is recomputed
    # ...and the server's start checks every run.
    assert _refresh(database_url, everything=True) == 1
    assert kept(database_url)["r02"] == before["r02"]


def test_a_mark_that_lagged_moves_on_past_runs_up_to_date(many, database_url):
    """A mark below runs already up to date (PostgreSQL's, behind a transaction that was running
    at the last refresh): the next sort reads them, recomputes none, and moves the mark on, so
    the sorts after it do not read them again."""
    many.get(RUNS, params={"sort": "loss"}).raise_for_status()
    _set_up(database_url, "UPDATE run_metric_values_mark SET changed = 0")
    assert _refresh(database_url) == 0
    mark = _mark(database_url)
    assert mark > 0  # (not past every stamp: on PostgreSQL no further than the oldest transaction running)


def test_values_of_other_formulas_written_since_are_recomputed_by_a_sort(many, database_url):
    """Two servers of other formulas over one database (an upgrade under way): values one wrote
    are rewritten by the other's next sort, though no totals changed."""
    many.get(RUNS, params={"sort": "loss"}).raise_for_status()
    before = kept(database_url)
    _set_up(database_url, f"UPDATE run_metric_values SET formulas = 'older', loss = NULL WHERE run_pk = {R02}")
    assert _refresh(database_url) == 1
    assert kept(database_url) == before


def test_a_batch_that_commits_after_a_later_one_is_still_seen(many, database_url, records):
    """PostgreSQL hands out transaction ids in begin order but commits in any: a batch with the
    lower id that commits after a refresh saw a later batch must be rechecked by the next one (a
    mark of the greatest stamp seen would pass it over). (SQLite serialises writers: a later
    batch cannot commit while one is open.)"""
    if not database_url.startswith("postgresql"):
        pytest.skip("SQLite serialises writers: no batch can commit after a later one began")
    assert _refresh(database_url) > 0
    engine = make_engine(database_url)
    try:
        with engine.connect() as slow:
            slow.execute(text(f'UPDATE run_totals SET "rows" = "rows" + 1 WHERE run_pk = {R02}'))  # not committed
            recs = [r for rank in range(2) for r in records(1, start=20, seed=9 + rank, rank=rank, gpus=1, steps=5)]
            many.post(f"{RUNS}/r05/intervals", json={"intervals": recs}).raise_for_status()
            assert _refresh(database_url) == 1  # r05; r02's write is not visible yet
            slow.commit()
        assert _refresh(database_url) == 1  # r02, its stamp below the greatest one the last refresh saw
        with engine.connect() as connection:
            rows = connection.execute(text(f'SELECT "rows" FROM run_totals WHERE run_pk = {R02}')).scalar_one()
        assert kept(database_url)["r02"]["rows"] == rows
    finally:
        engine.dispose()
