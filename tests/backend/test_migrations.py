"""Alembic owns the schema: `upgrade head` on an empty database must equal the models."""

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from packscope.backend.store.db import alembic_config, make_engine, upgrade_schema
from packscope.backend.store.models import Base
from tests.backend.migrating import downgrade


def test_upgrade_head_equals_the_models(database_url):
    engine = make_engine(database_url)
    try:
        upgrade_schema(engine)
        upgrade_schema(engine)  # a second start finds nothing to do
        with engine.connect() as connection:
            diff = compare_metadata(MigrationContext.configure(connection), Base.metadata)
            version = connection.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
        assert diff == []
        assert version == ScriptDirectory.from_config(alembic_config()).get_current_head()
        tables = set(inspect(engine).get_table_names())
        assert {"runs", "intervals", "interval_details", "rollups", "run_totals", "run_sync_sites"} <= tables
        assert not {"interval_histograms", "interval_sync_sites"} & tables  # tables of revisions before 0003
        uniques = inspect(engine).get_unique_constraints("intervals")
        assert [sorted(u["column_names"]) for u in uniques] == [["interval", "rank", "run_pk"]]
    finally:
        engine.dispose()


def test_sqlite_runs_in_wal_mode_with_foreign_keys(sqlite_url):
    engine = make_engine(sqlite_url)
    try:
        with engine.connect() as connection:
            assert connection.execute(text("PRAGMA journal_mode")).scalar_one() == "wal"
            assert connection.execute(text("PRAGMA foreign_keys")).scalar_one() == 1
    finally:
        engine.dispose()


def test_0013_keeps_every_row_and_rows_stored_before_it_count_every_step(make_client, database_url, new_run, records):
    """0013 adds syncs_uncounted_steps to the intervals, rollups and totals in place: down, the
    rows stay; up again, the rows stored without it hold 0, so their syncs per iteration divide by
    every step, as the agents before it counted them."""

    client = make_client(database_url)
    assert client.post("/api/v1/runs", json=new_run()).status_code == 201
    recs = records(6)  # intervals 2 and 5 uncounted
    assert client.post("/api/v1/runs/run-1/intervals", json={"intervals": recs}).json()["accepted"] == 6
    counted = sum(r["steps"] - r["syncs"].get("uncounted_steps", 0) for r in recs)
    syncs = sum(r["syncs"]["total"] for r in recs)
    assert client.get("/api/v1/runs/run-1").json()["totals"]["syncs_per_iter"] == pytest.approx(syncs / counted)
    engine = make_engine(database_url)
    try:
        downgrade(engine, "0012")
        with engine.connect() as connection:
            for table in ("intervals", "rollups", "run_totals"):
                assert "syncs_uncounted_steps" not in {c["name"] for c in inspect(connection).get_columns(table)}
            assert connection.execute(text("SELECT count(*) FROM intervals")).scalar_one() == 6
        upgrade_schema(engine)
    finally:
        engine.dispose()
    all_steps = sum(r["steps"] for r in recs)
    totals = make_client(database_url).get("/api/v1/runs/run-1").json()["totals"]
    assert totals["syncs_per_iter"] == pytest.approx(syncs / all_steps)


def test_0014_backfills_the_lr_and_grad_norm_sums_of_stored_rows(make_client, database_url, new_run, records):
    """0014 adds Σ lr·steps, Σ grad_norm·steps and their steps to the rollups and totals: rows
    stored before it are summed in by its own SQL, so their charts read as a fresh ingest's."""

    client = make_client(database_url)
    assert client.post("/api/v1/runs", json=new_run()).status_code == 201
    recs = records(40)
    for r in recs[::5]:
        r["grad_norm"] = None  # a reading some intervals lack: it weighs nothing
    assert client.post("/api/v1/runs/run-1/intervals", json={"intervals": recs}).json()["accepted"] == 40

    def charted():
        c = make_client(database_url)
        series = c.get("/api/v1/runs/run-1/series", params={"max_points": 5}).json()["columns"]
        totals = c.get("/api/v1/runs/run-1").json()["totals"]
        return series["lr"], series["grad_norm"], totals["lr"], totals["grad_norm"]

    before = charted()
    with_norm = [r for r in recs if r["grad_norm"] is not None]
    expected = sum(r["grad_norm"] * r["steps"] for r in with_norm) / sum(r["steps"] for r in with_norm)
    assert before[2] == pytest.approx(3e-4) and before[3] == pytest.approx(expected)
    assert len(before[0]) > 1 and None not in before[0] + before[1]
    engine = make_engine(database_url)
    try:
        downgrade(engine, "0013")
        with engine.connect() as connection:
            assert "lr_x_steps" not in {c["name"] for c in inspect(connection).get_columns("rollups")}
        upgrade_schema(engine)
    finally:
        engine.dispose()
    after = charted()
    assert after[:2] == (pytest.approx(before[0]), pytest.approx(before[1]))
    assert after[2:] == (pytest.approx(before[2]), pytest.approx(before[3]))


def test_0015_leaves_rows_stored_before_it_not_measured(make_client, database_url, new_run, records):
    """0015 adds the ledger's measurements to the intervals, rollups and totals: rows stored
    before it hold NULL, so their data wait and launch-bound idle are "not measured", never 0."""

    client = make_client(database_url)
    assert client.post("/api/v1/runs", json=new_run()).status_code == 201
    recs = records(8)
    for r in recs:
        r.update(data_wait_s=0.01, data_wait_gaps=9, traced_steps=3, traced_step_time_s=0.3)
        r.update(traced_busy_s=0.2, sync_idle_s=0.05, launch_idle_s=0.05)
    assert client.post("/api/v1/runs/run-1/intervals", json={"intervals": recs}).json()["accepted"] == 8

    def terms():
        ledger = make_client(database_url).get("/api/v1/runs/run-1/ledger").json()
        return {t["name"]: t["status"] for t in ledger["terms"]}

    assert terms()["data_wait"] == "measured" and terms()["launch_bound"] == "estimated"
    engine = make_engine(database_url)
    try:
        downgrade(engine, "0014")
        with engine.connect() as connection:
            assert "data_wait_s" not in {c["name"] for c in inspect(connection).get_columns("intervals")}
        upgrade_schema(engine)
    finally:
        engine.dispose()
    assert terms()["data_wait"] == "not measured" and terms()["launch_bound"] == "not measured"


def test_0021_leaves_rows_stored_before_it_with_the_whole_data_wait(make_client, database_url, new_run, records):
    """0021 adds the syncs' idle between the traced steps (traced_gaps, sync_idle_between_s) to the
    intervals, rollups, totals and first intervals: rows stored before it hold NULL, so the
    ledger keeps their whole data wait, its between-steps part of the syncs "not measured"."""

    client = make_client(database_url)
    assert client.post("/api/v1/runs", json=new_run()).status_code == 201
    recs = records(8)
    for r in recs:
        r.update(data_wait_s=0.09, data_wait_gaps=9, traced_steps=3, traced_step_time_s=0.3)
        r.update(traced_busy_s=0.2, sync_idle_s=0.05, launch_idle_s=0.05, traced_gaps=2, sync_idle_between_s=0.012)
    assert client.post("/api/v1/runs/run-1/intervals", json={"intervals": recs}).json()["accepted"] == 8

    def terms():
        ledger = make_client(database_url).get("/api/v1/runs/run-1/ledger").json()
        return {t["name"]: t for t in ledger["terms"]}

    moved = terms()
    assert moved["data_wait"]["detail"]["to_host_syncs_ms"] == pytest.approx(6.0)  # 12 ms over 2 gaps
    assert moved["data_wait"]["detail"]["wait_ms"] == pytest.approx(10.0 - 6.0)
    assert moved["host_syncs"]["detail"]["between_steps"] is not None
    engine = make_engine(database_url)
    try:
        downgrade(engine, "0020")
        with engine.connect() as connection:
            for table in ("intervals", "rollups", "run_totals", "run_first_interval"):
                columns = {c["name"] for c in inspect(connection).get_columns(table)}
                assert not {"traced_gaps", "sync_idle_between_s"} & columns, table
            assert connection.execute(text("SELECT count(*) FROM intervals")).scalar_one() == 8
        upgrade_schema(engine)
    finally:
        engine.dispose()
    kept = terms()
    assert kept["data_wait"]["status"] == "measured" and kept["data_wait"]["detail"]["wait_ms"] == pytest.approx(10.0)
    assert kept["data_wait"]["detail"]["to_host_syncs_ms"] is None
    assert kept["host_syncs"]["detail"]["between_steps"] is None
    assert kept["host_syncs"]["ms_per_step"] < moved["host_syncs"]["ms_per_step"]


def test_0024_leaves_rows_stored_before_it_without_audio(make_client, database_url, new_run, records):
    """0024 adds the audio sums to the intervals, rollups, totals and first intervals, and the kept
    metric audio_share_pct: down, the rows stay; up again, the rows stored without them hold 0 (their
    agents counted no audio tower), and the run reads as before."""

    client = make_client(database_url)
    assert client.post("/api/v1/runs", json=new_run()).status_code == 201
    assert client.post("/api/v1/runs/run-1/intervals", json={"intervals": records(6)}).json()["accepted"] == 6
    before = client.get("/api/v1/runs/run-1").json()["totals"]
    engine = make_engine(database_url)
    try:
        downgrade(engine, "0023")
        with engine.connect() as connection:
            for table in ("intervals", "rollups", "run_totals", "run_first_interval"):
                columns = {c["name"] for c in inspect(connection).get_columns(table)}
                assert not {"audio_clips", "audio_sq_sum", "audio_blocks"} & columns, table
            assert "audio_share_pct" not in {c["name"] for c in inspect(connection).get_columns("run_metric_values")}
            assert connection.execute(text("SELECT count(*) FROM intervals")).scalar_one() == 6
        upgrade_schema(engine)
        with engine.connect() as connection:
            assert connection.execute(text("SELECT sum(audio_clips) FROM intervals")).scalar_one() == 0
    finally:
        engine.dispose()
    after = make_client(database_url).get("/api/v1/runs/run-1").json()["totals"]
    assert after == before and after["audio_share_pct"] == 0.0


def test_0025_leaves_rows_stored_before_it_without_cross_attention(make_client, database_url, new_run, records):
    """0025 adds the cross-attention sums (mllama) to the intervals, rollups, totals and first
    intervals: down, the rows stay; up again, the rows stored without them hold 0 (their models had
    no cross-attention layers), and the run reads as before."""

    client = make_client(database_url)
    assert client.post("/api/v1/runs", json=new_run()).status_code == 201
    assert client.post("/api/v1/runs/run-1/intervals", json={"intervals": records(6)}).json()["accepted"] == 6
    before = client.get("/api/v1/runs/run-1").json()["totals"]
    engine = make_engine(database_url)
    try:
        downgrade(engine, "0024")
        with engine.connect() as connection:
            for table in ("intervals", "rollups", "run_totals", "run_first_interval"):
                columns = {c["name"] for c in inspect(connection).get_columns(table)}
                assert not {"cross_text_tokens", "cross_pairs"} & columns, table
            assert connection.execute(text("SELECT count(*) FROM intervals")).scalar_one() == 6
        upgrade_schema(engine)
        with engine.connect() as connection:
            assert connection.execute(text("SELECT sum(cross_pairs) FROM intervals")).scalar_one() == 0
    finally:
        engine.dispose()
    after = make_client(database_url).get("/api/v1/runs/run-1").json()["totals"]
    assert after == before


# A migration that adds ledger measurements to the intervals (and their sums to the rollups,
# totals and first intervals): the revision before it, its fields, the host syncs' detail that
# shows them and that detail's value (ms) while the rows carry them, of the step's ms.
LEDGER_FIELD_MIGRATIONS = {
    "0026 the host's blocked time": ("0025", ("sync_blocked_s", "sync_blocked_between_s"), "host_blocked_ms",
                                     lambda step_ms: 60 / 3 + 2 / 2),
    "0027 the syncs' loops": ("0026", ("sync_loop_idle_s", "sync_loop_blocked_s"), "loop_ms",
                              lambda step_ms: 0.03 / 0.3 * step_ms),
}  # fmt: skip


@pytest.mark.parametrize("migration", LEDGER_FIELD_MIGRATIONS)
def test_ledger_fields_of_rows_stored_before_their_migration_are_not_measured(
    make_client, database_url, new_run, records, migration
):
    """Down past the migration, the rows stay; up again, they hold NULL in its fields, and the
    ledger shows what they measure "not measured" (null), never 0."""
    before, fields, detail, carried = LEDGER_FIELD_MIGRATIONS[migration]
    client = make_client(database_url)
    assert client.post("/api/v1/runs", json=new_run()).status_code == 201
    recs = records(6)
    for r in recs:
        r.update(traced_steps=3, traced_step_time_s=0.3, traced_busy_s=0.2, sync_idle_s=0.05, launch_idle_s=0.05)
        r.update(traced_gaps=2, sync_idle_between_s=0.01, sync_blocked_s=0.06, sync_blocked_between_s=0.002)
        r.update(sync_loop_idle_s=0.03, sync_loop_blocked_s=0.003)
    assert client.post("/api/v1/runs/run-1/intervals", json={"intervals": recs}).json()["accepted"] == 6

    def shown():
        ledger = make_client(database_url).get("/api/v1/runs/run-1/ledger").json()
        return {t["name"]: t for t in ledger["terms"]}["host_syncs"]["detail"][detail], ledger["step_time_ms"]

    value, step_ms = shown()
    assert value == pytest.approx(carried(step_ms))
    engine = make_engine(database_url)
    try:
        downgrade(engine, before)
        with engine.connect() as connection:
            for table in ("intervals", "rollups", "run_totals", "run_first_interval"):
                columns = {c["name"] for c in inspect(connection).get_columns(table)}
                assert not set(fields) & columns, table
            assert connection.execute(text("SELECT count(*) FROM intervals")).scalar_one() == 6
        upgrade_schema(engine)
        with engine.connect() as connection:
            assert connection.execute(text(f"SELECT count({fields[0]}) FROM intervals")).scalar_one() == 0
    finally:
        engine.dispose()
    assert shown()[0] is None
