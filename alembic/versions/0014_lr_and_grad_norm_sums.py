"""The sums behind the learning-rate and gradient-norm charts, in the rollups and the run totals:
Σ lr·steps and Σ steps where an interval has an lr, the same for the gradient norm (both are read
at an interval's end, so a chart point weights each interval by its steps).

Frozen: the backfill is this file's own SQL, on the stored interval rows (level 1 and the run
totals from the intervals, each coarser level from the four blocks below it).

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-06
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

AGGREGATES = ("rollups", "run_totals")
LEVELS = range(1, 11)  # the rollup levels stored (level 0 is not)
# Each new sum: its SQL over interval rows `i` (a missing reading adds nothing).
NEW_SUMS = {
    "lr_x_steps": "CASE WHEN i.lr IS NULL THEN 0 ELSE i.lr * i.steps END",
    "lr_steps": "CASE WHEN i.lr IS NULL THEN 0 ELSE i.steps END",
    "grad_norm_x_steps": "CASE WHEN i.grad_norm IS NULL THEN 0 ELSE i.grad_norm * i.steps END",
    "grad_norm_steps": "CASE WHEN i.grad_norm IS NULL THEN 0 ELSE i.steps END",
}


def _sum_of(expression: str, where: str) -> str:
    return f"COALESCE((SELECT SUM({expression}) FROM intervals i WHERE {where}), 0)"


def upgrade() -> None:
    for table in AGGREGATES:
        for name in NEW_SUMS:
            op.add_column(table, sa.Column(name, sa.Float(), nullable=False, server_default="0"))
    totals = ", ".join(f"{name} = {_sum_of(sql, 'i.run_pk = run_totals.run_pk')}" for name, sql in NEW_SUMS.items())
    op.execute(f"UPDATE run_totals SET {totals}")
    in_block = "i.run_pk = rollups.run_pk AND i.interval >= rollups.block * 4 AND i.interval < rollups.block * 4 + 4"
    level_1 = ", ".join(f"{name} = {_sum_of(sql, in_block)}" for name, sql in NEW_SUMS.items())
    op.execute(f"UPDATE rollups SET {level_1} WHERE level = 1")
    below = (
        "FROM rollups r WHERE r.run_pk = rollups.run_pk AND r.level = rollups.level - 1"
        " AND r.block >= rollups.block * 4 AND r.block < rollups.block * 4 + 4"
    )
    coarser = ", ".join(f"{name} = COALESCE((SELECT SUM(r.{name}) {below}), 0)" for name in NEW_SUMS)
    for level in LEVELS[1:]:
        op.execute(f"UPDATE rollups SET {coarser} WHERE level = {level}")


def downgrade() -> None:
    for table in AGGREGATES:
        for name in NEW_SUMS:
            op.drop_column(table, name)
