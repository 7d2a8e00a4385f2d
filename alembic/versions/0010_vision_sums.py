"""The vision tower's sums (packscope.core.vision: images, patches, Σ p² and Σ over windows of w²),
per interval row, in the rollups and in the run totals.

Rows stored before hold 0: their runs' models had no tower the agents before this revision counted.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SUMS = ("vision_images", "vision_patches", "vision_sq_sum", "vision_window_sq_sum")


def upgrade() -> None:
    for name in SUMS:
        op.add_column("intervals", sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"))
        for table in ("rollups", "run_totals"):
            op.add_column(table, sa.Column(name, sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    for name in SUMS:
        for table in ("intervals", "rollups", "run_totals"):
            op.drop_column(table, name)
