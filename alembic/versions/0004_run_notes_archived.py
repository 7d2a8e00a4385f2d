"""Runs gain `notes` (free text, edited on the runs page) and `archived` (hidden from the default list).

Both have server defaults, so existing rows need no backfill.

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Batch mode: SQLite copies the table; PostgreSQL gets plain ALTER TABLE … ADD COLUMN.
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("notes", sa.Text(), server_default="", nullable=False))
        batch.add_column(sa.Column("archived", sa.Boolean(), server_default=sa.false(), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("archived")
        batch.drop_column("notes")
