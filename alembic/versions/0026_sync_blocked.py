"""The host's time blocked in sync calls during the traced steps (docs/ledger.md): per interval
row, inside the traced steps (`sync_blocked_s`) and in the traced gaps between them
(`sync_blocked_between_s`); in the rollups, the run totals and the runs' first intervals, those
two and the traced steps and gaps of the rows that carry them (`blocked_traced_steps`,
`blocked_traced_gaps`).

Rows stored before hold NULL (their agent did not measure it: "not measured") and add 0 to the
sums, which count only the rows that carry them.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-07
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0026"
down_revision: str | None = "0025"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Each new interval column (nullable: a record without it is not measured), written out:
# migrations are frozen.
NEW_FIELDS = ("sync_blocked_s", "sync_blocked_between_s")
# The sums, in every table that keeps the catalogue's SUMS.
NEW_SUMS = ("blocked_traced_steps", "blocked_traced_gaps", "sync_blocked_s", "sync_blocked_between_s")
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
