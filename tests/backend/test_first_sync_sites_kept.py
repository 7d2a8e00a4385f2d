"""The first interval's sync sites kept at ingest (run_first_sync_sites, store/aggregates.py) against
a brute-force sum over the stored rows: ranks and intervals in random orders and batches (a lower
interval arriving after higher ones, the first interval's ranks split over batches, replays),
several runs in one database, concurrent batches on PostgreSQL; the backfill of migration 0022
(also for runs stored before 0016); and a run without a kept first-interval row, whose sites are
summed from its rows."""

import json
import random
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import text

from packscope.backend.ingest.batches import ingest_together
from packscope.backend.ingest.rows import parsed_records
from packscope.backend.store.db import make_engine, make_sessionmaker, upgrade_schema
from packscope.backend.store.first_interval import _summed_rows, first_interval_sums
from tests.backend.migrating import downgrade

RUNS = "/api/v1/runs"
SITES = [f"layer{j}.py:{10 * j}" for j in range(6)]


def with_sites(record, rng):
    """`record` with its own sync sites: a random few of SITES with random counts, or none (one
    interval in three is uncounted, as the records fixture sends it)."""
    syncs = record["syncs"]
    if syncs.get("uncounted_steps"):
        return record
    picked = rng.sample(SITES, rng.randint(0, len(SITES)))
    sites = [{"site": site, "count": rng.randint(0, 40)} for site in picked]
    return {**record, "syncs": {"total": sum(s["count"] for s in sites) + rng.randint(0, 5), "sites": sites}}


def stored_rows(connection, run_id):
    """Every stored row's (interval, sync sites), decoded here from interval_details' JSON."""
    rows = connection.execute(
        text(
            "SELECT i.interval, d.sync_sites FROM intervals i JOIN interval_details d ON d.interval_id = i.id "
            "JOIN runs r ON r.id = i.run_pk WHERE r.run_id = :r"
        ),
        {"r": run_id},
    ).all()
    return [(interval, json.loads(s) if isinstance(s, str) else s) for interval, s in rows]


def brute_force(rows):
    """(the first interval's sites, the whole run's sites), summed over the rows."""
    first = min(interval for interval, _ in rows)
    whole, head = Counter(), Counter()
    for interval, sites in rows:
        for site, n in sites.items():
            whole[site] += n
            if interval == first:
                head[site] += n
    return dict(head), dict(whole)


def steady_sites(client, run_id):
    answer = client.get(f"{RUNS}/{run_id}/sync-sites", params={"limit": 100, "window": "steady"}).json()
    return answer["window"], [(s["site"], s["count"]) for s in answer["sites"]]


def expected_steady(rows):
    head, whole = brute_force(rows)
    several = len({interval for interval, _ in rows}) > 1
    left = {site: n - (head.get(site, 0) if several else 0) for site, n in whole.items()}
    ranked = sorted(((s, n) for s, n in left.items() if n > 0), key=lambda item: (-item[1], item[0]))
    return ("steady" if several else "run"), ranked


def check(database_url, client, run_ids):
    """The kept sites, the reads' answers and the kept table's intervals against the stored rows;
    the intervals of the kept rows of each run."""
    held = {}
    engine = make_engine(database_url)
    try:
        with make_sessionmaker(engine)() as session:
            pks = dict(session.execute(text("SELECT run_id, id FROM runs")).all())
            kept = first_interval_sums(session, [pks[r] for r in run_ids], with_sites=True)
            for run_id in run_ids:
                rows = stored_rows(session, run_id)
                pk = pks[run_id]
                head, _ = brute_force(rows)
                assert kept[pk].sync_sites == head, run_id
                # What the reads summed from the rows before the sites were kept: the same.
                assert _summed_rows(session, [pk], with_sites=True)[pk].sync_sites == head
                held[run_id] = set(
                    session.execute(
                        text("SELECT DISTINCT interval FROM run_first_sync_sites WHERE run_pk = :p"), {"p": pk}
                    ).scalars()
                )
                first = min(interval for interval, _ in rows)
                assert held[run_id] <= {first}  # a replaced interval's sites are gone
    finally:
        engine.dispose()
    for run_id in run_ids:
        assert steady_sites(client, run_id) == expected_steady(stored_rows_of(database_url, run_id))
    return held


def stored_rows_of(database_url, run_id):
    engine = make_engine(database_url)
    try:
        with engine.connect() as connection:
            return stored_rows(connection, run_id)
    finally:
        engine.dispose()


def shuffled_run(records, rng, run_seed):
    """The records of a run of 1 to 4 ranks over 2 to 5 of intervals 1..8 (0 is left for a later
    lower interval), in a random order in which the lowest interval's first record comes after
    some higher one's."""
    ranks = rng.randint(1, 4)
    chosen = sorted(rng.sample(range(1, 9), rng.randint(2, 5)))
    recs = [
        with_sites(r, rng)
        for rank in range(ranks)
        for i in chosen
        for r in records(1, start=i, seed=run_seed * 100 + rank * 10 + i, rank=rank, gpus=1)
    ]
    rng.shuffle(recs)
    lowest = [k for k, r in enumerate(recs) if r["interval"] == chosen[0]]
    if lowest[0] == 0:  # a higher interval first
        later = next(k for k, r in enumerate(recs) if r["interval"] != chosen[0])
        recs[0], recs[later] = recs[later], recs[0]
    return recs


def test_the_kept_first_sites_equal_the_rows_in_any_order(make_client, database_url, new_run, records):
    client = make_client(database_url)
    rng = random.Random(39)
    runs = {f"run-{k}": shuffled_run(records, rng, k) for k in range(4)}
    for run_id in runs:
        assert client.post(RUNS, json=new_run(run_id)).status_code == 201
    sent: dict[str, list] = {run_id: [] for run_id in runs}
    # The runs' batches interleaved: each run's first batch its first record (a higher interval than
    # its lowest), then 1 to 4 new records and maybe a replay of sent ones.
    pending = {run_id: list(recs) for run_id, recs in runs.items()}
    lowest = {run_id: min(r["interval"] for r in recs) for run_id, recs in runs.items()}
    replaced = 0  # checks that found kept sites of an interval a lower one replaces later
    while pending:
        run_id = rng.choice(sorted(pending))
        take = rng.randint(1, 4) if sent[run_id] else 1
        batch, pending[run_id] = pending[run_id][:take], pending[run_id][take:]
        replay = rng.sample(sent[run_id], min(len(sent[run_id]), rng.randint(0, 2)))
        client.post(f"{RUNS}/{run_id}/intervals", json={"intervals": batch + replay}).raise_for_status()
        sent[run_id] += batch
        if not pending[run_id]:
            del pending[run_id]
        held = check(database_url, client, [run_id])[run_id]
        replaced += bool(held) and min(held) > lowest[run_id]
    check(database_url, client, sorted(runs))
    assert replaced  # the runs' order had kept sites replaced


def test_0022_keeps_the_sites_of_runs_stored_before_it(make_client, database_url, new_run, records):
    """The backfill, for runs stored before 0022 and before 0016 (first-interval row rows = -1); and
    what ingest adds to the backfilled sites after: the same interval's ranks, then a lower one."""
    client = make_client(database_url)
    rng = random.Random(22)
    runs = {f"run-{k}": shuffled_run(records, rng, k) for k in range(3)}
    for run_id, recs in runs.items():
        assert client.post(RUNS, json=new_run(run_id)).status_code == 201
        client.post(f"{RUNS}/{run_id}/intervals", json={"intervals": recs}).raise_for_status()
    before = {run_id: steady_sites(client, run_id) for run_id in runs}
    for revision in ("0021", "0014"):
        engine = make_engine(database_url)
        try:
            downgrade(engine, revision)
            upgrade_schema(engine)
        finally:
            engine.dispose()
        client = make_client(database_url)
        assert {run_id: steady_sites(client, run_id) for run_id in runs} == before
        check(database_url, client, sorted(runs))
    # After 0014 -> head the first-interval rows are marked: ranks of the same interval add to the
    # backfilled sites, a lower interval replaces them.
    first = min(r["interval"] for r in runs["run-0"])
    late = [with_sites(r, rng) for r in records(1, start=first, seed=7, rank=9, gpus=1)]
    client.post(f"{RUNS}/run-0/intervals", json={"intervals": late}).raise_for_status()
    check(database_url, client, ["run-0"])
    lower = [with_sites(r, rng) for r in records(1, start=0, seed=8, rank=0, gpus=1)]
    client.post(f"{RUNS}/run-0/intervals", json={"intervals": lower}).raise_for_status()
    check(database_url, client, ["run-0"])


def test_a_run_without_a_kept_first_interval_sums_its_rows(make_client, database_url, new_run, records):
    client = make_client(database_url)
    rng = random.Random(7)
    assert client.post(RUNS, json=new_run("run-1")).status_code == 201
    recs = shuffled_run(records, rng, 1)
    client.post(f"{RUNS}/run-1/intervals", json={"intervals": recs}).raise_for_status()
    engine = make_engine(database_url)
    try:
        with engine.begin() as connection:
            connection.execute(text("DELETE FROM run_first_interval"))
    finally:
        engine.dispose()
    check(database_url, client, ["run-1"])


@pytest.mark.postgres
def test_concurrent_batches_of_one_run_keep_the_sites_of_its_rows(make_client, postgres, new_run, records):
    """PostgreSQL, where batches of one run are written in concurrent transactions (one per server
    process): 24 batches sent together, each in its own transaction, ranks of intervals 1 to 3 and,
    among them, interval 0's; then the kept sites against the rows."""
    rng = random.Random(5)
    batches = [
        [with_sites(r, rng) for r in records(1, start=rng.choice((0, 1, 1, 2, 3)), seed=k, rank=k, gpus=1)]
        for k in range(24)
    ]
    client = make_client(postgres)
    assert client.post(RUNS, json=new_run("run-1")).status_code == 201
    engine = make_engine(postgres, pool_size=len(batches))
    start = threading.Barrier(len(batches))

    def send(batch):
        parsed = parsed_records(batch)
        start.wait()
        return ingest_together(engine, [("run-1", parsed)])[0].accepted

    try:
        with ThreadPoolExecutor(len(batches)) as pool:
            assert list(pool.map(send, batches)) == [1] * len(batches)
    finally:
        engine.dispose()
    check(postgres, client, ["run-1"])
