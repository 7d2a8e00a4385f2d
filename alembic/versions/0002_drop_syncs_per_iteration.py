"""Drop intervals.syncs_per_iteration: it is syncs_total / steps, derived like every other rate.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("intervals") as batch:  # batch: SQLite rebuilds the table
        batch.drop_column("syncs_per_iteration")


def downgrade() -> None:
    with op.batch_alter_table("intervals") as batch:
        batch.add_column(sa.Column("syncs_per_iteration", sa.Float(), nullable=False, server_default="0"))
