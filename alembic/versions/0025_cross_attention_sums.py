"""The cross-attention sums of a tower read through cross-attention layers (mllama:
packscope.core.vision CROSS_SUMS), per interval row, in the rollups, the run totals and the runs'
first intervals.

Rows stored before hold 0: their models had no such layers (their model dicts carry no
cross_layers, so no coefficient reads these sums). The kept metrics are recomputed by their
formulas' fingerprint (store/metric_values.py), which probes every vision sum.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The record's cross-attention sums at this revision (written out: migrations are frozen).
SUMS = ("cross_text_tokens", "cross_pairs")
SUM_TABLES = ("rollups", "run_totals", "run_first_interval")


def upgrade() -> None:
    for name in SUMS:
        op.add_column("intervals", sa.Column(name, sa.BigInteger(), nullable=False, server_default="0"))
        for table in SUM_TABLES:
            op.add_column(table, sa.Column(name, sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    for name in SUMS:
        for table in ("intervals", *SUM_TABLES):
            op.drop_column(table, name)
