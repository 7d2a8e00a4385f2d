"""Alerts (docs/alerts.md): `alerts` (one row per opened alert; a partial unique index keeps one
open alert per run, rule and subject, whatever the number of server processes), `alert_outbox`
(one webhook message per alert, event and target, claimed by one process at a time),
`alert_settings` (thresholds and webhooks set through the API, per project) and
`nonfinite_losses` (the intervals whose loss arrived as NaN or ±inf, which the interval row
stores as missing).

Frozen: written out, importing nothing from the package.

Revision ID: 0017
Revises: 0014
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "alerts",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("rule", sa.String(32), nullable=False),
        sa.Column("subject", sa.String(500), nullable=False),
        sa.Column("opened_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("resolved_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("ledger_term", sa.String(32), nullable=True),
        sa.Column("details", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], name="fk_alerts_run_pk_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name="pk_alerts"),
    )
    op.create_index(
        "ix_alerts_open",
        "alerts",
        ["run_pk", "rule", "subject"],
        unique=True,
        sqlite_where=sa.text("resolved_at IS NULL"),
        postgresql_where=sa.text("resolved_at IS NULL"),
    )
    op.create_index("ix_alerts_run_pk_opened_at", "alerts", ["run_pk", "opened_at"])
    op.create_table(
        "alert_outbox",
        sa.Column("id", BIG_ID, nullable=False),
        sa.Column("alert_id", sa.BigInteger(), nullable=False),
        sa.Column("event", sa.String(16), nullable=False),
        sa.Column("target", sa.String(2000), nullable=False),
        sa.Column("body", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("claimed_by", sa.String(64), nullable=True),
        sa.Column("claim_expires_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.ForeignKeyConstraint(
            ["alert_id"], ["alerts.id"], name="fk_alert_outbox_alert_id_alerts", ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name="pk_alert_outbox"),
        sa.UniqueConstraint("alert_id", "event", "target", name="uq_alert_outbox_alert_id_event_target"),
    )
    op.create_index("ix_alert_outbox_sent_at_next_attempt_at", "alert_outbox", ["sent_at", "next_attempt_at"])
    op.create_table(
        "alert_settings",
        sa.Column("project", sa.String(200), nullable=False),
        sa.Column("settings", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("project", name="pk_alert_settings"),
    )
    op.create_table(
        "nonfinite_losses",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("interval", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], name="fk_nonfinite_losses_run_pk_runs", ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_pk", "interval", "rank", name="pk_nonfinite_losses"),
    )


def downgrade() -> None:
    op.drop_table("nonfinite_losses")
    op.drop_table("alert_settings")
    op.drop_index("ix_alert_outbox_sent_at_next_attempt_at", table_name="alert_outbox")
    op.drop_table("alert_outbox")
    op.drop_index("ix_alerts_run_pk_opened_at", table_name="alerts")
    op.drop_index("ix_alerts_open", table_name="alerts")
    op.drop_table("alerts")
