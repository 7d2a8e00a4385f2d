"""`run_totals.changed`, a stamp that grows with every write of a run's totals, kept by a trigger,
with its index; `run_metric_values_mark`, the stamp below which every run's kept metrics are up
to date; an index on `run_metric_values.formulas`. Together they let a metric sort of the runs
list recheck only the runs whose totals changed since its last refresh, and ask "any values of
other formulas?" by one index probe, instead of joining every run's totals (issue 39).

The stamp is the database's own, so no writer of run_totals (ingest, a migration) can forget it:
* PostgreSQL (13 or later): the writing transaction's id (pg_current_xact_id, 64 bits with its
  epoch), set by a BEFORE row trigger. A reader's snapshot xmin bounds it: every transaction with
  a lower id has ended, so its rows are visible to any later read (store/metric_values.py).
* SQLite: one more than the greatest stamp stored, set by AFTER triggers (SQLite's cannot change
  NEW). Writers are serialised, so a later commit always stamps higher than any row a reader saw.

Rows stored before have stamp 0 and no mark exists: the first refresh checks every run.

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_POSTGRESQL = (
    """CREATE FUNCTION run_totals_stamp() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        NEW.changed := pg_current_xact_id()::text::bigint;
        RETURN NEW;
    END $$""",
    "CREATE TRIGGER run_totals_stamp BEFORE INSERT OR UPDATE ON run_totals "
    "FOR EACH ROW EXECUTE FUNCTION run_totals_stamp()",
)
_POSTGRESQL_DOWN = ("DROP TRIGGER run_totals_stamp ON run_totals", "DROP FUNCTION run_totals_stamp()")

# `UPDATE OF "rows"`: every write of the totals adds rows, and the stamp's own UPDATE (which sets
# `changed` alone) does not fire it again, even with recursive triggers on.
_STAMP = (
    "UPDATE run_totals SET changed = (SELECT coalesce(max(changed), 0) + 1 FROM run_totals) WHERE run_pk = NEW.run_pk"
)
_SQLITE = (
    f"CREATE TRIGGER run_totals_stamp_insert AFTER INSERT ON run_totals BEGIN {_STAMP}; END",
    f'CREATE TRIGGER run_totals_stamp_update AFTER UPDATE OF "rows" ON run_totals BEGIN {_STAMP}; END',
)
_SQLITE_DOWN = ("DROP TRIGGER run_totals_stamp_insert", "DROP TRIGGER run_totals_stamp_update")


def upgrade() -> None:
    op.add_column("run_totals", sa.Column("changed", sa.BigInteger(), nullable=False, server_default="0"))
    op.create_index(op.f("ix_run_totals_changed"), "run_totals", ["changed"])
    op.create_index(op.f("ix_run_metric_values_formulas"), "run_metric_values", ["formulas"])
    op.create_table(
        "run_metric_values_mark",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("changed", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run_metric_values_mark")),
    )
    for sql in _POSTGRESQL if op.get_bind().dialect.name == "postgresql" else _SQLITE:
        op.execute(sql)


def downgrade() -> None:
    for sql in _POSTGRESQL_DOWN if op.get_bind().dialect.name == "postgresql" else _SQLITE_DOWN:
        op.execute(sql)
    op.drop_table("run_metric_values_mark")
    op.drop_index(op.f("ix_run_metric_values_formulas"), table_name="run_metric_values")
    op.drop_index(op.f("ix_run_totals_changed"), table_name="run_totals")
    op.drop_column("run_totals", "changed")
