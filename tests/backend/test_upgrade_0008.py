"""Migration 0008 on a populated database: the steps counted once, the per-rank steps and the new
sums it backfills in SQL from the stored rows equal what ingest writes for the same records at head.

Revision 0007's aggregates hold, for every column they share with head, what head's ingest writes
(the same arithmetic), with `steps` summed over every rank. So a database at 0007 is made from one
populated at head: the same rows, its aggregates without the new columns and with `rank_steps` as
`steps`. Upgraded, it must hold what head holds.
"""

import math

import pytest
import sqlalchemy as sa

from packscope.backend.store.db import make_engine, upgrade_schema

NEW_COLUMNS = (
    "steps",
    "step_p50_x_steps",
    "step_p90_x_steps",
    "gpu_clock_x_s",
    "gpu_clock_s",
    "gpu_mem_x_s",
    "gpu_mem_s",
)
# Columns of revisions after 0008 (0009: the layer kinds' sums; 0010: the vision tower's).
LATER_COLUMNS = {
    *(f"{kind}_sq_sum_{view}" for kind in ("window", "chunk") for view in ("thd", "bshd")),
    "vision_images",
    "vision_patches",
    "vision_sq_sum",
    "vision_window_sq_sum",
}
# 0020's write stamp of run_totals (set by a trigger on each write): no sum, it differs between
# the two databases by design.
STAMPS = {"changed"}
AGGREGATES = {"rollups": ("run_pk", "level", "block"), "run_totals": ("run_pk",)}
COPIED = ("runs", "intervals", "interval_details", "channel_rollups", "run_sync_sites")


def _counted(recs: list[dict]) -> list[dict]:
    """The records as agents before revision 0013 sent them: every interval's syncs counted."""
    for r in recs:
        r["syncs"].pop("uncounted_steps", None)
    return recs


def _populate(client, new_run, records) -> None:
    """Two runs: three ranks with gaps and NVML readings on some intervals, and one rank."""
    assert client.post("/api/v1/runs", json=new_run("multi")).status_code == 201
    assert client.post("/api/v1/runs", json=new_run("single")).status_code == 201
    recs = []
    for rank in range(3):
        for r in _counted(records(90, seed=rank, rank=rank, gpus=1)):
            if r["interval"] % 7 == rank:
                continue  # a rank's interval missing
            if r["interval"] % 3 == 0:
                r["gpu"] = {"util_pct": 80.0, "sm_clock_mhz": 1700.0 + rank + r["interval"], "mem_used_bytes": 7e10}
            recs.append(r)
    for at in range(0, len(recs), 64):
        assert client.post("/api/v1/runs/multi/intervals", json={"intervals": recs[at : at + 64]}).status_code == 200
    single = _counted(records(21, seed=9))
    assert client.post("/api/v1/runs/single/intervals", json={"intervals": single}).status_code == 200


def _rows(engine: sa.Engine, table: str, key: tuple[str, ...]) -> dict[tuple, dict]:
    with engine.connect() as connection:
        result = connection.execute(sa.text(f"SELECT * FROM {table}"))
        return {tuple(row[k] for k in key): dict(row) for row in result.mappings()}


def test_0008_backfills_what_ingest_writes(database_url, make_client, new_run, records, tmp_path):
    # Head: the app ingests into a fresh database; a second database of the same kind is made at 0007.
    head_url = database_url
    client = make_client(head_url)
    _populate(client, new_run, records)
    old_url = f"sqlite:///{tmp_path / 'at_0007.db'}" if head_url.startswith("sqlite") else None
    if old_url is None:
        pytest.importorskip("psycopg")
        old_url = head_url.rsplit("/", 1)[0] + "/" + head_url.rsplit("/", 1)[1] + "_0007"
        admin = sa.create_engine(head_url, isolation_level="AUTOCOMMIT")
        with admin.connect() as connection:
            connection.execute(sa.text(f'CREATE DATABASE "{old_url.rsplit("/", 1)[1]}"'))
        admin.dispose()
    head, old = make_engine(head_url), make_engine(old_url)
    try:
        upgrade_schema(old, "0007")
        meta, head_meta = sa.MetaData(), sa.MetaData()
        meta.reflect(bind=old)
        head_meta.reflect(bind=head)
        with head.connect() as source, old.begin() as target:
            for table in COPIED:
                columns = set(meta.tables[table].columns.keys())  # 0007's; later revisions' columns stay behind
                rows = [
                    {k: v for k, v in r.items() if k in columns}
                    for r in source.execute(sa.select(head_meta.tables[table])).mappings()
                ]
                if rows:
                    target.execute(meta.tables[table].insert(), rows)
            for table in AGGREGATES:
                rows = []
                columns = set(meta.tables[table].columns.keys()) | {"rank_steps"}
                for r in source.execute(sa.select(head_meta.tables[table])).mappings():
                    row = {k: v for k, v in r.items() if k not in NEW_COLUMNS and k in columns}
                    row["steps"] = row.pop("rank_steps")  # 0007's steps: summed over every rank
                    rows.append(row)
                target.execute(meta.tables[table].insert(), rows)
            if old.dialect.name == "postgresql":  # the copied ids: move the sequences past them
                for table in ("runs", "intervals"):
                    target.execute(sa.text(f"SELECT setval('{table}_id_seq', (SELECT max(id) FROM {table}))"))
        upgrade_schema(old)

        checked = 0
        for table, key in AGGREGATES.items():
            want, got = _rows(head, table, key), _rows(old, table, key)
            assert set(got) == set(want) and want, table
            for k, row in want.items():
                for column, value in row.items():
                    if column in LATER_COLUMNS or column in STAMPS:  # 0 in both (no such layers); a stamp
                        continue
                    stored = got[k][column]
                    if column in ("steps", "rank_steps", "rows", "first_step", "last_step"):
                        assert stored == value, (table, k, column)  # counts: exact
                    elif value is None or (isinstance(value, float) and math.isnan(value)):
                        assert stored is None or math.isnan(stored), (table, k, column)
                    else:  # float sums added in another order
                        assert stored == pytest.approx(value, rel=1e-12, abs=1e-300), (table, k, column)
                    checked += 1
        assert checked > 1000
        # The point of the migration: 3 ranks, each step once.
        totals = _rows(old, "run_totals", ("run_pk",))
        multi = next(r for r in totals.values() if r["rank_steps"] > r["steps"])
        assert multi["steps"] == 90 * 10 - sum(10 for i in range(90) if i % 7 == 0)  # rank 0's intervals
    finally:
        head.dispose()
        old.dispose()
        if old_url.startswith("postgresql"):
            admin = sa.create_engine(head_url, isolation_level="AUTOCOMMIT")
            with admin.connect() as connection:
                connection.execute(sa.text(f'DROP DATABASE IF EXISTS "{old_url.rsplit("/", 1)[1]}" WITH (FORCE)'))
            admin.dispose()
