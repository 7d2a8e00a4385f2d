"""Rollups keep levels 1..10: a level-0 block is one interval merged over its ranks, which the
series reads now group from `intervals` themselves (over fewer than 4·max_points intervals, or
at most 3 at each end of a range), so ingest stops writing it (issue 8: it was two thirds of the
rollup rows a batch of one rank wrote). The level-0 rows are deleted; nothing else changes.
`channel_rollups` keeps its level 0.

The downgrade writes level 0 back from the interval rows (one INSERT … SELECT … GROUP BY per run).

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


def upgrade() -> None:
    op.execute("DELETE FROM rollups WHERE level = 0")


def downgrade() -> None:
    # Imported here: level 0 is grouped exactly as the reads group it.
    from packscope.backend.columns import BLOCK_FLOAT_COLUMNS, BLOCK_INT_COLUMNS
    from packscope.backend.models import rollups
    from packscope.backend.queries import interval_blocks
    from packscope.core.catalogue import Coefficients

    connection = op.get_bind()
    runs = sa.table("runs", sa.column("id"), sa.column("model", sa.JSON), sa.column("hardware", sa.JSON))
    intervals = sa.table("intervals", sa.column("run_pk"), sa.column("interval"))
    for run in connection.execute(sa.select(runs.c.id, runs.c.model, runs.c.hardware)).all():
        span = connection.execute(
            sa.select(sa.func.min(intervals.c.interval), sa.func.max(intervals.c.interval)).where(
                intervals.c.run_pk == run.id
            )
        ).one()
        if span[0] is None:
            continue
        grouped = interval_blocks(run.id, Coefficients.for_run(run.model, run.hardware), span).subquery()
        columns = ["run_pk", "level", "block", *BLOCK_INT_COLUMNS, *BLOCK_FLOAT_COLUMNS]
        connection.execute(
            rollups.insert().from_select(
                columns, sa.select(sa.literal(run.id), *(grouped.c[name] for name in columns[1:]))
            )
        )
