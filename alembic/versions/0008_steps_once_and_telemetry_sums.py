"""Steps counted once per step, and the sums behind the step-time quantile and NVML clock and
memory charts, in the rollups and the run totals.

* `steps` held Σ steps over every rank's rows: it becomes `rank_steps` (what per-rank means such
  as step time divide by), and a new `steps` holds rank 0's steps alone (every rank runs the same
  optimizer steps, so a 2-rank run of 20 steps has 20, not 40).
* new sums: Σ p50·steps and Σ p90·steps (the step-time quantile charts), Σ clock·host time and
  Σ host time with a clock reading, the same for memory in use.

Frozen: the backfill is this file's own SQL, on the stored interval rows (level 1 and the run
totals from the intervals, each coarser level from the four blocks below it).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

AGGREGATES = ("rollups", "run_totals")
LEVELS = range(1, 11)  # the rollup levels stored (level 0 is not)
# Each new sum: its SQL over interval rows `i`, and whether only rank 0's rows count.
NEW_SUMS = {
    "steps": ("i.steps", True),
    "step_p50_x_steps": ("i.step_time_p50_s * i.steps", False),
    "step_p90_x_steps": ("i.step_time_p90_s * i.steps", False),
    "gpu_clock_x_s": ("CASE WHEN i.gpu_sm_clock_mhz IS NULL THEN 0 ELSE i.gpu_sm_clock_mhz * i.host_time_s END", False),
    "gpu_clock_s": ("CASE WHEN i.gpu_sm_clock_mhz IS NULL THEN 0 ELSE i.host_time_s END", False),
    "gpu_mem_x_s": (
        "CASE WHEN i.gpu_mem_used_bytes IS NULL THEN 0 ELSE i.gpu_mem_used_bytes * i.host_time_s END",
        False,
    ),
    "gpu_mem_s": ("CASE WHEN i.gpu_mem_used_bytes IS NULL THEN 0 ELSE i.host_time_s END", False),
}


def _sum_of(expression: str, leader: bool, where: str) -> str:
    rank = " AND i.rank = 0" if leader else ""
    return f"COALESCE((SELECT SUM({expression}) FROM intervals i WHERE {where}{rank}), 0)"


def upgrade() -> None:
    for table in AGGREGATES:
        op.execute(f"ALTER TABLE {table} RENAME COLUMN steps TO rank_steps")
        for name in NEW_SUMS:
            op.add_column(table, sa.Column(name, sa.Float(), nullable=False, server_default="0"))
    names = list(NEW_SUMS)
    totals = ", ".join(
        f"{name} = {_sum_of(sql, leader, 'i.run_pk = run_totals.run_pk')}" for name, (sql, leader) in NEW_SUMS.items()
    )
    op.execute(f"UPDATE run_totals SET {totals}")
    # Level 1: blocks of 4 intervals, from the interval rows (the unique index on run_pk, interval,
    # rank serves the range).
    in_block = "i.run_pk = rollups.run_pk AND i.interval >= rollups.block * 4 AND i.interval < rollups.block * 4 + 4"
    level_1 = ", ".join(f"{name} = {_sum_of(sql, leader, in_block)}" for name, (sql, leader) in NEW_SUMS.items())
    op.execute(f"UPDATE rollups SET {level_1} WHERE level = 1")
    # Level k: the four blocks of level k - 1 below each block.
    below = (
        "FROM rollups r WHERE r.run_pk = rollups.run_pk AND r.level = rollups.level - 1"
        " AND r.block >= rollups.block * 4 AND r.block < rollups.block * 4 + 4"
    )
    coarser = ", ".join(f"{name} = COALESCE((SELECT SUM(r.{name}) {below}), 0)" for name in names)
    for level in LEVELS[1:]:
        op.execute(f"UPDATE rollups SET {coarser} WHERE level = {level}")


def downgrade() -> None:
    for table in AGGREGATES:
        for name in NEW_SUMS:
            op.drop_column(table, name)
        op.execute(f"ALTER TABLE {table} RENAME COLUMN rank_steps TO steps")
