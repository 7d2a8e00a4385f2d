"""Intervals gain `channel_tokens`: the tokens behind each channel's mean loss, so per-channel
losses can be added up over intervals and ranks (token-weighted), as every other sum is.

Older rows keep NULL: their channel means carry no weight.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-30
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A nullable column: a plain ALTER TABLE on both backends, no table copy.
    op.add_column("intervals", sa.Column("channel_tokens", sa.JSON(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("intervals") as batch:
        batch.drop_column("channel_tokens")
