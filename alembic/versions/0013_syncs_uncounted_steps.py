"""The steps whose host syncs the agent did not count (`syncs.uncounted_steps`), per interval row,
in the rollups and in the run totals: the agent counts syncs over one interval in a few
(AgentConfig.count_syncs_every), and syncs per iteration divide by the steps that were counted.

Rows stored before hold 0: the agents before this revision counted every step.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAME = "syncs_uncounted_steps"


def upgrade() -> None:
    op.add_column("intervals", sa.Column(NAME, sa.Integer(), nullable=False, server_default="0"))
    for table in ("rollups", "run_totals"):
        op.add_column(table, sa.Column(NAME, sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    for table in ("intervals", "rollups", "run_totals"):
        op.drop_column(table, NAME)
