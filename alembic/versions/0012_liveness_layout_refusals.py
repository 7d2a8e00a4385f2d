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

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


# Plain ALTER TABLE on both databases (SQLite adds and, since 3.35, drops a column in place): a batch
# migration would copy `runs`, and dropping the old table under foreign keys deletes every row of
# every table that refers to it.
NEW_COLUMNS = (
    ("last_contact_at", sa.DateTime(timezone=True)),
    ("heartbeat_s", sa.Float()),
    ("layout_seen", sa.String(16)),
    ("pack_length", sa.Integer()),
    ("pack_length_from", sa.String(200)),
)


def upgrade() -> None:
    for name, kind in NEW_COLUMNS:
        op.add_column("runs", sa.Column(name, kind, nullable=True))
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
    for name, _ in reversed(NEW_COLUMNS):
        op.drop_column("runs", name)
