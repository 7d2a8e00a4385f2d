"""Migrations 0003 and 0006 on a populated database: the rollups, channel rollups, run totals, sync
sites and detail rows they backfill from older revisions' rows equal what ingest writes for the
same records at head."""

import json
import random
from datetime import UTC, datetime
from typing import Any

import pytest
import sqlalchemy as sa
from alembic import command

from packscope.backend.store.db import alembic_config, make_engine, upgrade_schema
from packscope.core.catalogue import FIELDS
from packscope.core.flops import ModelSpec

AGGREGATES = ("rollups", "channel_rollups", "run_totals", "run_sync_sites")


def store_at_0002(engine: sa.Engine, body: dict[str, Any], recs: list[dict[str, Any]]) -> None:
    """The run and its records as revision 0002 stored them: a wide row, a row per non-empty
    histogram bucket, a row per sync site."""
    meta = sa.MetaData()
    meta.reflect(bind=engine)
    now = datetime.now(UTC)
    with engine.begin() as connection:
        run_pk = connection.execute(
            meta.tables["runs"]
            .insert()
            .values(
                run_id=body["run_id"],
                name=body["name"],
                project=body["project"],
                tags=body["tags"],
                config={},
                model=ModelSpec.from_dict(body["model"]).to_dict(),
                hardware=body["hardware"],
                parallel=body["parallel"],
                layout=body["layout"],
                status="running",
                started_at=now,
                ended_at=None,
                created_at=now,
                updated_at=now,
            )
            .returning(meta.tables["runs"].c.id)
        ).scalar_one()
        for rec in recs:
            row: dict[str, Any] = {"run_pk": run_pk, "channel_loss": None}
            for f in FIELDS:
                value: Any = rec
                for key in f.wire_path:
                    value = (value or {}).get(key)
                row[f.name] = value
            interval_id = connection.execute(
                meta.tables["intervals"].insert().values(**row).returning(meta.tables["intervals"].c.id)
            ).scalar_one()
            for kind, hist in rec["histograms"].items():
                for bucket, (count, tokens) in enumerate(zip(hist["count"], hist["tokens"], strict=True)):
                    if count or tokens:
                        connection.execute(
                            meta.tables["interval_histograms"]
                            .insert()
                            .values(interval_id=interval_id, kind=kind, bucket=bucket, count=count, tokens=tokens)
                        )
            for site in rec["syncs"]["sites"]:
                connection.execute(
                    meta.tables["interval_sync_sites"]
                    .insert()
                    .values(interval_id=interval_id, site=site["site"], count=site["count"])
                )


def as_json(value: Any) -> Any:
    return json.loads(value) if isinstance(value, str) else value


def aggregates(engine: sa.Engine) -> dict[str, list[tuple[Any, ...]]]:
    meta = sa.MetaData()
    meta.reflect(bind=engine, only=[*AGGREGATES, "interval_details"])
    out: dict[str, list[tuple[Any, ...]]] = {}
    with engine.connect() as connection:
        for name in AGGREGATES:
            table = meta.tables[name]
            columns = [c for c in table.columns if c.name != "run_pk"]
            keys = [c for c in table.primary_key.columns if c.name != "run_pk"]
            rows = connection.execute(sa.select(*columns).order_by(*keys)).all()
            out[name] = [tuple(round(v, 6) if isinstance(v, float) else v for v in row) for row in rows]
        details = meta.tables["interval_details"]
        out["details"] = sorted(
            (json.dumps(as_json(h), sort_keys=True), json.dumps(as_json(s), sort_keys=True))
            for h, s in connection.execute(sa.select(details.c.histograms, details.c.sync_sites))
        )
    return out


def with_channels(recs: list[dict[str, Any]], rng: random.Random) -> None:
    """Channel losses with their tokens, and on some records without them (an older agent)."""
    for r in recs:
        r["channel_loss"] = {c: rng.uniform(1.0, 4.0) for c in ("code", "web")}
        if rng.random() < 0.8:
            r["channel_tokens"] = {"code": rng.randint(1, 5000), "web": rng.randint(0, 5000)}


def ingested(make_client, tmp_path, body, recs):
    client = make_client(f"sqlite:///{tmp_path / 'ingested.db'}")
    assert client.post("/api/v1/runs", json=body).status_code == 201
    assert client.post(f"/api/v1/runs/{body['run_id']}/intervals", json={"intervals": recs}).status_code == 200
    engine = make_engine(f"sqlite:///{tmp_path / 'ingested.db'}")
    try:
        return aggregates(engine)
    finally:
        engine.dispose()


@pytest.mark.parametrize("ranks", [1, 3])
def test_backfill_equals_what_ingest_writes(database_url, make_client, new_run, records, ranks, tmp_path):
    recs = [r for rank in range(ranks) for r in records(23, seed=rank, rank=rank)]  # odd count: partial blocks
    body = new_run("backfilled")

    old = make_engine(database_url)
    try:
        upgrade_schema(old, "0002")
        store_at_0002(old, body, recs)
        upgrade_schema(old)
        backfilled = aggregates(old)
    finally:
        old.dispose()

    want = ingested(make_client, tmp_path, body, recs)
    assert backfilled["run_totals"] and backfilled["rollups"] and backfilled["run_sync_sites"]
    assert all(row[-2] is not None and row[-1] is not None for row in backfilled["rollups"])  # wall extent
    for name in (*AGGREGATES, "details"):
        assert backfilled[name] == want[name], name


@pytest.mark.parametrize("ranks", [1, 3])
def test_0006_rebuilds_rollups_with_channels(database_url, make_client, new_run, records, ranks, tmp_path):
    """Rows stored before 0006 (channel_tokens came in 0005) gain channel rollups and the
    rollups' wall-clock extent; rollups stored before it are replaced, not added to."""
    recs = [r for rank in range(ranks) for r in records(41, seed=rank, rank=rank)]
    with_channels(recs, random.Random(ranks))
    body = new_run("rebuilt")

    old = make_engine(database_url)
    try:
        upgrade_schema(old, "0002")
        store_at_0002(old, body, recs)
        upgrade_schema(old, "0005")
        meta = sa.MetaData()
        meta.reflect(bind=old, only=["intervals", "rollups"])
        table = meta.tables["intervals"]
        with old.begin() as connection:
            for r in recs:  # what a 0005 server stored for these records
                connection.execute(
                    table.update()
                    .where(table.c.interval == r["interval"], table.c.rank == r["rank"])
                    .values(channel_loss=r["channel_loss"], channel_tokens=r.get("channel_tokens"))
                )
            stale = {c.name: 1 for c in meta.tables["rollups"].columns if not c.nullable}
            connection.execute(meta.tables["rollups"].insert().values({**stale, "level": 0, "block": 0}))
        upgrade_schema(old)
        backfilled = aggregates(old)
    finally:
        old.dispose()

    want = ingested(make_client, tmp_path, body, recs)
    assert backfilled["channel_rollups"] and backfilled["rollups"]
    for name in (*AGGREGATES, "details"):
        assert backfilled[name] == want[name], name


def store_channels_at_0005(engine: sa.Engine, recs: list[dict[str, Any]]) -> None:
    """The records' channel losses and tokens, as a 0005 server stored them."""
    meta = sa.MetaData()
    meta.reflect(bind=engine, only=["intervals"])
    table = meta.tables["intervals"]
    with engine.begin() as connection:
        for r in recs:
            connection.execute(
                table.update()
                .where(table.c.interval == r["interval"], table.c.rank == r["rank"])
                .values(channel_loss=r["channel_loss"], channel_tokens=r.get("channel_tokens"))
            )


def downgrade_schema(engine: sa.Engine, revision: str) -> None:
    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, revision)


@pytest.mark.parametrize("ranks", [1, 3])
def test_0007_deletes_level_0_and_its_downgrade_writes_it_back(
    database_url, make_client, new_run, records, oracle, ranks, tmp_path
):
    """Level 0 (one interval, merged over its ranks) is grouped from the intervals by the reads
    since 0007, which deletes the stored rows on a populated database; its downgrade groups them
    back from the intervals, each equal to a brute-force sum over the interval's ranks."""
    recs = [r for rank in range(ranks) for r in records(23, seed=rank, rank=rank, gpus=2)]
    recs[4]["gpu_time_s"] = 0.0  # an undefined rate: a NULL band end where it is the only row
    with_channels(recs, random.Random(ranks))
    body = new_run("levels")
    engine = make_engine(database_url)
    try:
        upgrade_schema(engine, "0002")
        store_at_0002(engine, body, recs)
        upgrade_schema(engine, "0005")
        store_channels_at_0005(engine, recs)
        upgrade_schema(engine)
        at_head = aggregates(engine)
        downgrade_schema(engine, "0006")
        columns = "block, rows, first_step, last_step, steps, tokens, tflops_thd_min, tflops_thd_max, wall_start_min"
        with engine.connect() as connection:
            level_0 = connection.exec_driver_sql(f"SELECT {columns} FROM rollups WHERE level = 0 ORDER BY block").all()
            channels_0 = connection.exec_driver_sql(
                "SELECT block, channel, loss_sum, tokens FROM channel_rollups WHERE level = 0"
            ).all()
        upgrade_schema(engine)
        again = aggregates(engine)
        with engine.connect() as connection:
            assert connection.exec_driver_sql("SELECT count(*) FROM rollups WHERE level = 0").scalar_one() == 0
            assert connection.exec_driver_sql("SELECT count(*) FROM channel_rollups WHERE level = 0").scalar_one() == 0
    finally:
        engine.dispose()

    assert at_head == again == ingested(make_client, tmp_path, body, recs)
    want_channels: dict[tuple[int, str], list[float]] = {}
    for r in recs:
        for channel, n in (r.get("channel_tokens") or {}).items():
            if n:
                sums = want_channels.setdefault((r["interval"], channel), [0.0, 0.0])
                sums[0] += r["channel_loss"][channel] * n
                sums[1] += n
    assert len(channels_0) == len(want_channels)
    for block, channel, loss_sum, tokens in channels_0:
        assert (loss_sum, tokens) == (pytest.approx(want_channels[block, channel][0]), want_channels[block, channel][1])
    assert [row.block for row in level_0] == list(range(23))
    for row in level_0:
        ranks_of = [r for r in recs if r["interval"] == row.block]
        assert (row.rows, row.first_step, row.last_step) == (ranks, ranks_of[0]["first_step"], ranks_of[0]["last_step"])
        assert (row.steps, row.tokens) == (sum(r["steps"] for r in ranks_of), sum(r["tokens"] for r in ranks_of))
        assert row.wall_start_min == min(r["wall_start"] for r in ranks_of)
        rates = [oracle([r])["tflops_thd"] for r in ranks_of if r["gpu_time_s"] > 0]
        if rates:
            assert (row.tflops_thd_min, row.tflops_thd_max) == (pytest.approx(min(rates)), pytest.approx(max(rates)))
        else:
            assert row.tflops_thd_min is None and row.tflops_thd_max is None
