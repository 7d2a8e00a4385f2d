"""Alembic owns the schema: `upgrade head` on an empty database must equal the models."""

from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, text

from packscope.backend.store.db import alembic_config, make_engine, upgrade_schema
from packscope.backend.store.models import Base


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
