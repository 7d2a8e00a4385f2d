"""The syncs' share of the time between steps (docs/ledger.md): per interval row, in the rollups,
the run totals and the runs' first intervals, the gaps between the steps CUPTI traced
(`traced_gaps`) and the GPU's idle time in those gaps that a host sync began
(`sync_idle_between_s`), which the ledger moves from the data wait to the host syncs.

Rows stored before hold NULL (their agent did not split it: "not measured", and the ledger keeps
the whole data wait as it did), and add 0 to the sums, which count only the rows that carry them.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Each new interval column and its type (nullable: a record without it is not measured).
NEW_FIELDS: dict[str, sa.types.TypeEngine] = {
    "traced_gaps": sa.Integer(),
    "sync_idle_between_s": sa.Float(),
}
# The sums of the same names, in every table that keeps the catalogue's SUMS.
NEW_SUMS = tuple(NEW_FIELDS)
SUM_TABLES = ("rollups", "run_totals", "run_first_interval")


def upgrade() -> None:
    for name, kind in NEW_FIELDS.items():
        op.add_column("intervals", sa.Column(name, kind, nullable=True))
    for table in SUM_TABLES:
        for name in NEW_SUMS:
            op.add_column(table, sa.Column(name, sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    for table in SUM_TABLES:
        for name in NEW_SUMS:
            op.drop_column(table, name)
    for name in NEW_FIELDS:
        op.drop_column("intervals", name)
