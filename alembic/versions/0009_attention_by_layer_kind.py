"""The attention sums of the sliding-window and chunked layers (packscope.core.attention), per
interval row, in the rollups and in the run totals.

A model with such layers (Gemma 2/3, GPT-OSS, Mistral-7B-v0.1, Llama 4, Qwen with
use_sliding_window) has one attention sum per layer kind. Rows stored before hold 0: their runs'
models had no such layers (the agents before this revision read every layer as full attention).

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

SUMS = ("window_sq_sum_bshd", "window_sq_sum_thd", "chunk_sq_sum_bshd", "chunk_sq_sum_thd")


def upgrade() -> None:
    for name in SUMS:
        op.add_column("intervals", sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"))
        for table in ("rollups", "run_totals"):
            op.add_column(table, sa.Column(name, sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    for name in SUMS:
        for table in ("intervals", "rollups", "run_totals"):
            op.drop_column(table, name)
