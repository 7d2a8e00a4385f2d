"""The schema as of 2026-12-01, in one revision: runs, one wide intervals table and its details,
rollups of every aligned block of 4^k intervals (k = 1..10, all ranks), their per-channel loss,
and each run's totals and sync sites.

Revisions 0001 to 0007 (never released) were squashed into this one, which keeps the id of the last
(0007), so a database built through them is already at this revision. Written out in full and
frozen: a migration imports nothing from the live backend, whose tables and arithmetic move on
(later revisions carry their own backfills, in SQL).

Revision ID: 0007
Revises:
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

TABLES = ("interval_details", "intervals", "rollups", "channel_rollups", "run_totals", "run_sync_sites", "runs")


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
        sa.Column("notes", sa.Text(), server_default="", nullable=False),
        sa.Column("archived", sa.Boolean(), server_default=sa.false(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_runs")),
        sa.UniqueConstraint("run_id", name=op.f("uq_runs_run_id")),
    )
    op.create_table(
        "channel_rollups",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("level", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("block", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("channel", sa.String(length=100), nullable=False),
        sa.Column("loss_sum", sa.Float(), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_pk"], ["runs.id"], name=op.f("fk_channel_rollups_run_pk_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_pk", "level", "block", "channel", name=op.f("pk_channel_rollups")),
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
        sa.Column("loss", sa.Float(), nullable=True),
        sa.Column("lr", sa.Float(), nullable=True),
        sa.Column("grad_norm", sa.Float(), nullable=True),
        sa.Column("gpu_util_pct", sa.Float(), nullable=True),
        sa.Column("gpu_power_w", sa.Float(), nullable=True),
        sa.Column("gpu_sm_clock_mhz", sa.Float(), nullable=True),
        sa.Column("gpu_mem_used_bytes", sa.Float(), nullable=True),
        sa.Column("gpu_energy_j", sa.Float(), nullable=True),
        sa.Column("channel_loss", sa.JSON(), nullable=True),
        sa.Column("channel_tokens", sa.JSON(), nullable=True),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], name=op.f("fk_intervals_run_pk_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_intervals")),
        sa.UniqueConstraint("run_pk", "interval", "rank", name=op.f("uq_intervals_run_pk_interval_rank")),
    )
    op.create_index(op.f("ix_intervals_run_pk_last_step"), "intervals", ["run_pk", "last_step"], unique=False)
    op.create_table(
        "rollups",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("level", sa.SmallInteger(), autoincrement=False, nullable=False),
        sa.Column("block", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("first_step", sa.BigInteger(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("steps", sa.Float(), nullable=False),
        sa.Column("gpu_time_s", sa.Float(), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("real_tokens", sa.Float(), nullable=False),
        sa.Column("seqlen_sq_sum_bshd", sa.Float(), nullable=False),
        sa.Column("seqlen_sq_sum_thd", sa.Float(), nullable=False),
        sa.Column("documents", sa.Float(), nullable=False),
        sa.Column("packs", sa.Float(), nullable=False),
        sa.Column("syncs_total", sa.Float(), nullable=False),
        sa.Column("loss_x_tokens", sa.Float(), nullable=False),
        sa.Column("loss_tokens", sa.Float(), nullable=False),
        sa.Column("gpu_util_x_s", sa.Float(), nullable=False),
        sa.Column("gpu_util_s", sa.Float(), nullable=False),
        sa.Column("gpu_power_x_s", sa.Float(), nullable=False),
        sa.Column("gpu_power_s", sa.Float(), nullable=False),
        sa.Column("gpu_energy_j", sa.Float(), nullable=False),
        sa.Column("energy_tokens", sa.Float(), nullable=False),
        sa.Column("tflops_bshd_min", sa.Float(), nullable=True),
        sa.Column("tflops_bshd_max", sa.Float(), nullable=True),
        sa.Column("tflops_thd_min", sa.Float(), nullable=True),
        sa.Column("tflops_thd_max", sa.Float(), nullable=True),
        sa.Column("tflops_useful_min", sa.Float(), nullable=True),
        sa.Column("tflops_useful_max", sa.Float(), nullable=True),
        sa.Column("step_time_s_min", sa.Float(), nullable=True),
        sa.Column("step_time_s_max", sa.Float(), nullable=True),
        sa.Column("wall_start_min", sa.Float(), nullable=True),
        sa.Column("wall_end_max", sa.Float(), nullable=True),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], name=op.f("fk_rollups_run_pk_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_pk", "level", "block", name=op.f("pk_rollups")),
    )
    op.create_table(
        "run_sync_sites",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("site", sa.String(length=500), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_pk"], ["runs.id"], name=op.f("fk_run_sync_sites_run_pk_runs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("run_pk", "site", name=op.f("pk_run_sync_sites")),
    )
    op.create_table(
        "run_totals",
        sa.Column("run_pk", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("last_interval", sa.Integer(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("steps", sa.Float(), nullable=False),
        sa.Column("gpu_time_s", sa.Float(), nullable=False),
        sa.Column("gpu_seconds", sa.Float(), nullable=False),
        sa.Column("tokens", sa.Float(), nullable=False),
        sa.Column("real_tokens", sa.Float(), nullable=False),
        sa.Column("seqlen_sq_sum_bshd", sa.Float(), nullable=False),
        sa.Column("seqlen_sq_sum_thd", sa.Float(), nullable=False),
        sa.Column("documents", sa.Float(), nullable=False),
        sa.Column("packs", sa.Float(), nullable=False),
        sa.Column("syncs_total", sa.Float(), nullable=False),
        sa.Column("loss_x_tokens", sa.Float(), nullable=False),
        sa.Column("loss_tokens", sa.Float(), nullable=False),
        sa.Column("gpu_util_x_s", sa.Float(), nullable=False),
        sa.Column("gpu_util_s", sa.Float(), nullable=False),
        sa.Column("gpu_power_x_s", sa.Float(), nullable=False),
        sa.Column("gpu_power_s", sa.Float(), nullable=False),
        sa.Column("gpu_energy_j", sa.Float(), nullable=False),
        sa.Column("energy_tokens", sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], name=op.f("fk_run_totals_run_pk_runs"), ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_pk", name=op.f("pk_run_totals")),
    )
    op.create_table(
        "interval_details",
        sa.Column("interval_id", _big_id(), nullable=False),
        sa.Column("histograms", sa.JSON(), nullable=False),
        sa.Column("sync_sites", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(
            ["interval_id"],
            ["intervals.id"],
            name=op.f("fk_interval_details_interval_id_intervals"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("interval_id", name=op.f("pk_interval_details")),
    )


def downgrade() -> None:
    for table in TABLES:
        op.drop_table(table)
