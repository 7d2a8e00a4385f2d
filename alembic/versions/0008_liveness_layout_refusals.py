"""What a run's agent tells the server beside its records, and what it could not send.

* `runs.last_contact_at`, `runs.heartbeat_s`: the agent's last heartbeat and how often it
  promised one, so that a run whose process died is shown stale, then crashed, instead of
  running for ever (the status shown is derived at read time; a later record revives it).
* `runs.layout_seen`, `runs.pack_length`, `runs.pack_length_from`: the layout the agent found
  in the batches (bshd, thd, thd-static or mixed; `layout` stays the one the run declared) and
  the pack length its baseline counted, with where that length came from.
* `refused_intervals`: intervals that the agent (bad batch input) or the server (a 4xx) refused,
  with the reason, so that a run page says why it is empty instead of waiting for ever.

All new columns are nullable: existing runs need no backfill.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Batch mode: SQLite copies the table; PostgreSQL gets plain ALTER TABLE … ADD COLUMN.
    with op.batch_alter_table("runs") as batch:
        batch.add_column(sa.Column("last_contact_at", sa.DateTime(timezone=True), nullable=True))
        batch.add_column(sa.Column("heartbeat_s", sa.Float(), nullable=True))
        batch.add_column(sa.Column("layout_seen", sa.String(16), nullable=True))
        batch.add_column(sa.Column("pack_length", sa.Integer(), nullable=True))
        batch.add_column(sa.Column("pack_length_from", sa.String(200), nullable=True))
    op.create_table(
        "refused_intervals",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("interval", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("first_step", sa.BigInteger(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("refused_by", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("refused_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], name="fk_refused_intervals_run_pk_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_pk", "rank", "interval", name="pk_refused_intervals"),
    )


def downgrade() -> None:
    op.drop_table("refused_intervals")
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("pack_length_from")
        batch.drop_column("pack_length")
        batch.drop_column("layout_seen")
        batch.drop_column("heartbeat_s")
        batch.drop_column("last_contact_at")
