"""The host syncs' loops in the traced steps (docs/ledger.md): per interval row, the GPU's idle
time inside regions bracketed by syncs that each waited at most a few small kernels
(`sync_loop_idle_s`, a part of `sync_idle_s`) and the host's time blocked in the syncs that
closed them (`sync_loop_blocked_s`); in the rollups, the run totals and the runs' first
intervals, those two and the traced steps and their time of the rows that carry them
(`loop_traced_steps`, `loop_traced_step_time_s`).

Rows stored before hold NULL (their agent did not split it: "not measured") and add 0 to the
sums, which count only the rows that carry them.

Revision ID: 0027
Revises: 0026
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Each new interval column (nullable: a record without it is not measured), written out:
# migrations are frozen.
NEW_FIELDS = ("sync_loop_idle_s", "sync_loop_blocked_s")
# The sums, in every table that keeps the catalogue's SUMS.
NEW_SUMS = ("loop_traced_steps", "loop_traced_step_time_s", "sync_loop_idle_s", "sync_loop_blocked_s")
SUM_TABLES = ("rollups", "run_totals", "run_first_interval")


def upgrade() -> None:
    for name in NEW_FIELDS:
        op.add_column("intervals", sa.Column(name, sa.Float(), nullable=True))
    for table in SUM_TABLES:
        for name in NEW_SUMS:
            op.add_column(table, sa.Column(name, sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    for table in SUM_TABLES:
        for name in NEW_SUMS:
            op.drop_column(table, name)
    for name in NEW_FIELDS:
        op.drop_column("intervals", name)
