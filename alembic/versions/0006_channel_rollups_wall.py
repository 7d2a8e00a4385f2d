"""Rollups gain the wall-clock extent of each block (`wall_start_min`, `wall_end_max`, for the
time x axes) and a sibling table `channel_rollups` (per-channel Σ mean·tokens and Σ tokens of
the same blocks, for the per-channel loss charts).

Both are rebuilt from the stored intervals: every rollup row is deleted and written again, run by
run, by the same code as ingest (packscope.backend.store.aggregates.store_rollups), so they equal what
ingest writes. Like 0003's backfill it reads every interval once, in Python: minutes on a
database of millions of intervals. Intervals without `channel_tokens` add nothing to the channel
rollups (their means carry no weight).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHUNK = 5000  # interval rows per rebuild step


def _rebuild(connection: sa.Connection) -> None:
    # Imported here: the rebuild aggregates exactly as ingest does (one implementation).
    from packscope.backend.ingest.rows import ROW_COLUMNS, row_key
    from packscope.backend.store.aggregates import store_rollups
    from packscope.backend.store.models import intervals
    from packscope.core.catalogue import Coefficients

    connection.execute(sa.text("DELETE FROM rollups"))
    # The runs' columns as of this revision (Core, not the ORM model, which later revisions may extend).
    runs = sa.table("runs", sa.column("id"), sa.column("model", sa.JSON), sa.column("hardware", sa.JSON))
    existing = {c["name"] for c in sa.inspect(connection).get_columns("intervals")}
    for run in connection.execute(sa.select(runs.c.id, runs.c.model, runs.c.hardware)).all():
        c = Coefficients.for_run(run.model, run.hardware)
        after = 0
        while True:
            chunk = connection.execute(
                # Columns later revisions add read as NULL: they do not exist yet at this one.
                sa.select(
                    intervals.c.id,
                    *(intervals.c[name] if name in existing else sa.null() for name in ROW_COLUMNS),
                )
                .where(intervals.c.run_pk == run.id, intervals.c.id > after)
                .order_by(intervals.c.id)
                .limit(CHUNK)
            ).all()
            if not chunk:
                break
            after = chunk[-1].id
            # Upserts add, so chunk by chunk is exact.
            store_rollups(connection, run.id, c, sorted((tuple(r)[1:] for r in chunk), key=row_key))


def upgrade() -> None:
    # Nullable columns: a plain ALTER TABLE on both backends, no table copy.
    op.add_column("rollups", sa.Column("wall_start_min", sa.Float(), nullable=True))
    op.add_column("rollups", sa.Column("wall_end_max", sa.Float(), nullable=True))
    op.create_table(
        "channel_rollups",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("block", sa.Integer(), nullable=False),
        sa.Column("channel", sa.String(length=100), nullable=False),
        sa.Column("loss_sum", sa.Float(), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_pk"], ["runs.id"], name=op.f("fk_channel_rollups_run_pk_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_pk", "level", "block", "channel", name=op.f("pk_channel_rollups")),
    )
    _rebuild(op.get_bind())


def downgrade() -> None:
    op.drop_table("channel_rollups")
    with op.batch_alter_table("rollups") as batch:
        batch.drop_column("wall_end_max")
        batch.drop_column("wall_start_min")
