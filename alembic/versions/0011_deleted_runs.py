"""`deleted_runs`: the ids of deleted runs, so that an agent still sending to one is answered
410 Gone instead of re-creating the run with only its later rows.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "deleted_runs",
        sa.Column("run_id", sa.String(64), nullable=False),
        sa.Column("deleted_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("run_id", name="pk_deleted_runs"),
    )


def downgrade() -> None:
    op.drop_table("deleted_runs")
