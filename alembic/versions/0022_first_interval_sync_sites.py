"""`run_first_sync_sites`: the sync sites of each run's first interval (the one run_first_interval
holds), summed over its ranks, so the steady window's sites read a few rows per run instead of
decoding every rank's row of that interval (issue 39). Kept at ingest from here on
(backend/store/aggregates.py).

Frozen: the backfill is this file's own code: for every run with a first-interval row (0016 gave
every run that had intervals one), the sites of that interval's rows, decoded from their JSON and
added up, each count stopping at 2^63 - 1 as the stored sums do. Runs stored before 0016 (their
first-interval row marked rows = -1) get theirs too: the interval is the one the row names.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-06
"""

import json
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

INT64_MAX = 2**63 - 1
CHUNK = 5_000  # rows a backfill INSERT carries


def upgrade() -> None:
    table = op.create_table(
        "run_first_sync_sites",
        sa.Column("run_pk", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("interval", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("site", sa.String(500), primary_key=True),
        sa.Column("count", sa.BigInteger(), nullable=False),
    )
    _backfill(table)


def _backfill(table: sa.Table) -> None:
    bind = op.get_bind()
    rows = bind.execute(
        sa.text(
            "SELECT f.run_pk, f.interval, d.sync_sites FROM run_first_interval f "
            "JOIN intervals i ON i.run_pk = f.run_pk AND i.interval = f.interval "
            "JOIN interval_details d ON d.interval_id = i.id ORDER BY f.run_pk"
        )
    )
    out: list[dict] = []
    key: tuple[int, int] | None = None
    counts: dict[str, int] = {}

    def flush() -> None:
        assert key is not None
        out.extend(
            {"run_pk": key[0], "interval": key[1], "site": site, "count": min(n, INT64_MAX)}
            for site, n in sorted(counts.items())
        )

    for run_pk, interval, stored in rows:
        if (run_pk, interval) != key:
            if key is not None:
                flush()
            if len(out) >= CHUNK:
                bind.execute(table.insert(), out)
                out = []
            key, counts = (run_pk, interval), {}
        for site, n in ((json.loads(stored) if isinstance(stored, str) else stored) or {}).items():
            counts[site] = counts.get(site, 0) + int(n)
    if key is not None:
        flush()
    if out:
        bind.execute(table.insert(), out)


def downgrade() -> None:
    op.drop_table("run_first_sync_sites")
