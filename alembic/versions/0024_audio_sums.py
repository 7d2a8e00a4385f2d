"""The audio tower's sums (packscope.core.audio_sums: Qwen3-Omni's and Gemma 4's, under one set of
names), per interval row, in the rollups, the run totals and the runs' first intervals; and the kept
metric audio_share_pct of the runs list.

Rows stored before hold 0: their agents left the audio tower out (their model dicts carry no audio
tower, so no coefficient reads these sums). The kept metrics are recomputed by their formulas'
fingerprint, which this revision's catalogue changes (store/metric_values.py).

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The record's audio sums at this revision (written out: migrations are frozen).
SUMS = (
    "audio_clips", "audio_chunks", "audio_conv1_frames", "audio_conv2_frames", "audio_conv3_frames",
    "audio_tokens", "audio_sq_sum", "audio_calls", "audio_positions", "audio_blocks",
)  # fmt: skip
SUM_TABLES = ("rollups", "run_totals", "run_first_interval")
METRIC = "audio_share_pct"


def upgrade() -> None:
    for name in SUMS:
        op.add_column("intervals", sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"))
        for table in SUM_TABLES:
            op.add_column(table, sa.Column(name, sa.Float(), nullable=False, server_default="0"))
    op.add_column("run_metric_values", sa.Column(METRIC, sa.Float(), nullable=True))


def downgrade() -> None:
    op.drop_column("run_metric_values", METRIC)
    for name in SUMS:
        for table in ("intervals", *SUM_TABLES):
            op.drop_column(table, name)
