"""Initial schema: runs, one wide intervals table, histogram buckets and sync sites.

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _big_id() -> sa.types.TypeEngine:
    # SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("run_id", sa.String(length=64), nullable=False),
        sa.Column("name", sa.String(length=200), nullable=True),
        sa.Column("project", sa.String(length=200), nullable=True),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("model", sa.JSON(), nullable=False),
        sa.Column("hardware", sa.JSON(), nullable=False),
        sa.Column("parallel", sa.JSON(), nullable=False),
        sa.Column("layout", sa.String(length=8), nullable=False),
        sa.Column("status", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("ended_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint("run_id", name=op.f("uq_runs_run_id")),
    )
    op.create_table(
        "intervals",
        sa.Column("id", _big_id(), nullable=False),
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("interval", sa.Integer(), nullable=False),
        sa.Column("rank", sa.Integer(), nullable=False),
        sa.Column("first_step", sa.BigInteger(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("steps", sa.Integer(), nullable=False),
        sa.Column("gpus", sa.Integer(), nullable=False),
        sa.Column("wall_start", sa.Float(), nullable=False),
        sa.Column("wall_end", sa.Float(), nullable=False),
        sa.Column("gpu_time_s", sa.Float(), nullable=False),
        sa.Column("host_time_s", sa.Float(), nullable=False),
        sa.Column("step_time_p50_s", sa.Float(), nullable=False),
        sa.Column("step_time_p90_s", sa.Float(), nullable=False),
        sa.Column("step_time_max_s", sa.Float(), nullable=False),
        sa.Column("timing_lag_steps", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.Column("real_tokens", sa.BigInteger(), nullable=False),
        sa.Column("packs", sa.BigInteger(), nullable=False),
        sa.Column("documents", sa.BigInteger(), nullable=False),
        sa.Column("seqlen_sq_sum_bshd", sa.BigInteger(), nullable=False),
        sa.Column("seqlen_sq_sum_thd", sa.BigInteger(), nullable=False),
        sa.Column("flops_bshd", sa.Float(), nullable=False),
        sa.Column("flops_thd", sa.Float(), nullable=False),
        sa.Column("flops_useful", sa.Float(), nullable=False),
        sa.Column("syncs_total", sa.BigInteger(), nullable=False),
        sa.Column("syncs_per_iteration", sa.Float(), nullable=False),
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("lr", sa.Float(), nullable=True),
        sa.Column("grad_norm", sa.Float(), nullable=True),
        sa.Column("channel_loss", sa.JSON(), nullable=True),
        sa.Column("gpu_util_pct", sa.Float(), nullable=True),
        sa.Column("gpu_power_w", sa.Float(), nullable=True),
        sa.Column("gpu_sm_clock_mhz", sa.Float(), nullable=True),
        sa.Column("gpu_mem_used_bytes", sa.Float(), nullable=True),
        sa.Column("gpu_energy_j", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], name=op.f("fk_intervals_run_pk_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_intervals")),
        # The idempotency key; `interval` before `rank` so the index also serves ordering by interval.
        sa.UniqueConstraint("run_pk", "interval", "rank", name=op.f("uq_intervals_run_pk_interval_rank")),
    )
    op.create_index(op.f("ix_intervals_run_pk_last_step"), "intervals", ["run_pk", "last_step"])
    op.create_table(
        "interval_histograms",
        sa.Column("id", _big_id(), nullable=False),
        sa.Column("interval_id", _big_id(), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("bucket", sa.SmallInteger(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("tokens", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("kind IN ('documents', 'packs')", name=op.f("ck_interval_histograms_kind")),
        sa.ForeignKeyConstraint(
            ["interval_id"],
            ["intervals.id"],
            name=op.f("fk_interval_histograms_interval_id_intervals"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_interval_histograms")),
        sa.UniqueConstraint(
            "interval_id", "kind", "bucket", name=op.f("uq_interval_histograms_interval_id_kind_bucket")
        ),
    )
    op.create_table(
        "interval_sync_sites",
        sa.Column("id", _big_id(), nullable=False),
        sa.Column("interval_id", _big_id(), nullable=False),
        sa.Column("site", sa.String(length=500), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["interval_id"],
            ["intervals.id"],
            name=op.f("fk_interval_sync_sites_interval_id_intervals"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_interval_sync_sites")),
        sa.UniqueConstraint("interval_id", "site", name=op.f("uq_interval_sync_sites_interval_id_site")),
    )


def downgrade() -> None:
    op.drop_table("interval_sync_sites")
    op.drop_table("interval_histograms")
    op.drop_index(op.f("ix_intervals_run_pk_last_step"), table_name="intervals")
    op.drop_table("intervals")
    op.drop_table("runs")
