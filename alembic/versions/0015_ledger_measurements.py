"""The loss ledger's time measurements (docs/ledger.md), per interval row, in the rollups and in
the run totals: the data wait (the GPU's idle time between consecutive steps and the gaps it
sums) and, over the steps CUPTI traced, their step time, the GPU's busy time, and its idle time
after host syncs and otherwise (host-/launch-bound).

Rows stored before hold NULL (their agent did not measure these: "not measured"), and add 0 to
the sums, which count only the rows that carry them.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Each new interval column and its type (all nullable: a record without it is not measured).
NEW_FIELDS: dict[str, sa.types.TypeEngine] = {
    "data_wait_s": sa.Float(),
    "data_wait_gaps": sa.BigInteger(),
    "traced_steps": sa.Integer(),
    "traced_step_time_s": sa.Float(),
    "traced_busy_s": sa.Float(),
    "sync_idle_s": sa.Float(),
    "launch_idle_s": sa.Float(),
}
# The sums of the same names, in the rollups and the run totals.
NEW_SUMS = tuple(NEW_FIELDS)


def upgrade() -> None:
    for name, kind in NEW_FIELDS.items():
        op.add_column("intervals", sa.Column(name, kind, nullable=True))
    for table in ("rollups", "run_totals"):
        for name in NEW_SUMS:
            op.add_column(table, sa.Column(name, sa.Float(), nullable=False, server_default="0"))


def downgrade() -> None:
    for table in ("rollups", "run_totals"):
        for name in NEW_SUMS:
            op.drop_column(table, name)
    for name in NEW_FIELDS:
        op.drop_column("intervals", name)
