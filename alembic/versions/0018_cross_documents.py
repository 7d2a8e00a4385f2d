"""Whether a run's packed documents attended to each other: `runs.cross_documents` (kept, crossed
or not checked) and `runs.cross_documents_detail` (the sentence the agent's check wrote), found by
the HF callback on a small copy of the model and sent like the layout it found (PATCH).

Both columns are nullable: existing runs need no backfill (null: no check reported).

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Plain ALTER TABLE, as 0012: a batch migration would copy `runs` under its foreign keys.
NEW_COLUMNS = (
    ("cross_documents", sa.String(16)),
    ("cross_documents_detail", sa.String(300)),
)


def upgrade() -> None:
    for name, kind in NEW_COLUMNS:
        op.add_column("runs", sa.Column(name, kind, nullable=True))


def downgrade() -> None:
    for name, _ in reversed(NEW_COLUMNS):
        op.drop_column("runs", name)
