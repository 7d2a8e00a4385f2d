"""`run_metric_values`: each run's derived metrics as its summary shows them, one nullable float
column per catalogue metric that is no plain total, so the runs list sorts by any of them in SQL
with its LIMIT (issue 39); `rows` is the run_totals rows a row was computed from (a cache that the
runs list refreshes when the run has more), `formulas` the fingerprint of the formulas that did.

Frozen: the metric names are written out as they are at this revision. The backfill is not this
file's: the values are the catalogue's formulas on each run's sums, and a migration may not import
the catalogue; the server computes every missing row right after migrating
(backend/store/metric_values.py, refresh, which upgrade_schema runs at head).

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

KEPT_METRICS = (
    "flops_bshd", "tflops_bshd", "mfu_bshd", "flops_thd", "tflops_thd", "mfu_thd", "flops_useful",
    "tflops_useful", "mfu_useful", "overcount_pct", "step_time_s", "step_time_p50_s", "step_time_p90_s",
    "tokens_per_gpu_s", "real_tokens_per_gpu_s", "attention_share_pct", "attention_full_pct",
    "attention_sliding_pct", "attention_chunked_pct", "vision_share_pct", "padding_pct", "syncs_per_iter",
    "loss", "lr", "grad_norm", "gpu_util_pct", "gpu_power_w", "gpu_sm_clock_mhz", "gpu_mem_used_bytes",
    "data_wait_step_s", "sync_idle_pct", "launch_idle_pct", "energy_per_token_j",
)  # fmt: skip


def upgrade() -> None:
    op.create_table(
        "run_metric_values",
        sa.Column("run_pk", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("formulas", sa.String(16), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        *(sa.Column(name, sa.Float(), nullable=True) for name in KEPT_METRICS),
    )


def downgrade() -> None:
    op.drop_table("run_metric_values")
