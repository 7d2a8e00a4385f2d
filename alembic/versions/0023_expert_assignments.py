"""A model with zero-computation experts (LongCat-Flash): per interval row, in the rollups, the run
totals and the runs' first intervals, the (token, top-k slot) assignments the router made to real
experts (`expert_assignments`), which its FLOPs price at the model's c_assignment each.

Rows stored before hold NULL (no agent counted them: no such model was counted), and add 0 to the
sum, which counts only the rows that carry it.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NEW_FIELD = "expert_assignments"
SUM_TABLES = ("rollups", "run_totals", "run_first_interval")


def upgrade() -> None:
    op.add_column("intervals", sa.Column(NEW_FIELD, sa.BigInteger(), nullable=True))
    for table in SUM_TABLES:
        op.add_column(table, sa.Column(NEW_FIELD, sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    for table in SUM_TABLES:
        op.drop_column(table, NEW_FIELD)
    op.drop_column("intervals", NEW_FIELD)
