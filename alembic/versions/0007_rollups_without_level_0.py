"""Rollups and channel rollups keep levels 1..10: a level-0 block is one interval merged over its
ranks, which the series reads now group from `intervals` themselves (over fewer than
4·max_points intervals, at most 8 rows per point, or at most 3 intervals at each end of a
range), so ingest stops writing it (issue 8: it was two thirds of the rollup rows a batch of one
rank wrote). The level-0 rows of both tables are deleted; nothing else changes.

The downgrade writes level 0 back from the interval rows, with the reads' (and ingest's) own arithmetic.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

CHUNK = 5000  # intervals per downgrade step


def upgrade() -> None:
    op.execute("DELETE FROM rollups WHERE level = 0")
    op.execute("DELETE FROM channel_rollups WHERE level = 0")


def downgrade() -> None:
    # Imported here: level 0 is grouped exactly as the reads group it (and as ingest did).
    from packscope.backend.store.aggregates import READ_COLUMNS, store_level_0, store_level_0_channels
    from packscope.core.catalogue import Coefficients

    connection = op.get_bind()
    runs = sa.table("runs", sa.column("id"), sa.column("model", sa.JSON), sa.column("hardware", sa.JSON))
    columns = ("run_pk", *READ_COLUMNS, "channel_loss", "channel_tokens")
    intervals = sa.table("intervals", *(sa.column(name) for name in columns))
    for run in connection.execute(sa.select(runs.c.id, runs.c.model, runs.c.hardware)).all():
        c = Coefficients.for_run(run.model, run.hardware)
        after = -1
        while True:  # CHUNK intervals at a time, each with all its ranks
            first = connection.execute(
                sa.select(sa.func.min(intervals.c.interval)).where(
                    intervals.c.run_pk == run.id, intervals.c.interval > after
                )
            ).scalar()
            if first is None:
                break
            after = first + CHUNK - 1
            rows = connection.execute(
                sa.select(*(intervals.c[name] for name in READ_COLUMNS))
                .where(intervals.c.run_pk == run.id, intervals.c.interval.between(first, after))
                .order_by(intervals.c.interval)
            ).all()
            store_level_0(connection, run.id, c, [tuple(row) for row in rows])
            channels = connection.execute(
                sa.select(intervals.c.interval, intervals.c.channel_loss, intervals.c.channel_tokens)
                .where(
                    intervals.c.run_pk == run.id,
                    intervals.c.interval.between(first, after),
                    intervals.c.channel_tokens.is_not(None),
                )
                .order_by(intervals.c.interval)
            ).all()
            store_level_0_channels(connection, run.id, [tuple(row) for row in channels])
