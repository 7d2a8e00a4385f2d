"""Rollups, run totals and run sync sites kept at ingest; one compact details row per interval.

* `rollups`: the catalogue's SUMS, rows, step span and per-interval band extremes of every aligned
  block of 4^level interval indexes (levels 0-10), so a chart reads about max_points rows.
* `run_totals` / `run_sync_sites`: per-run sums and sync-site counts.
* `interval_details`: an interval's length histograms and sync sites as JSON, replacing the
  row-per-bucket `interval_histograms` and row-per-site `interval_sync_sites` tables.

The backfill reads every stored interval once, in Python: on a database of millions of intervals
it takes minutes. It runs with the same aggregation code as ingest (packscope.backend.store.aggregates),
so the totals it writes are those ingest would have written. It leaves `rollups` empty: today's
rollups have columns that 0006 adds, and 0006 builds them from the stored intervals.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-30
"""

from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The catalogue's SUMS and band metrics as of this revision (a later catalogue change adds its
# own migration).
SUMS = (
    "steps",
    "gpu_time_s",
    "gpu_seconds",
    "tokens",
    "real_tokens",
    "seqlen_sq_sum_bshd",
    "seqlen_sq_sum_thd",
    "documents",
    "packs",
    "syncs_total",
    "loss_x_tokens",
    "loss_tokens",
    "gpu_util_x_s",
    "gpu_util_s",
    "gpu_power_x_s",
    "gpu_power_s",
    "gpu_energy_j",
    "energy_tokens",
)
BANDS = ("tflops_bshd", "tflops_thd", "tflops_useful", "step_time_s")
KINDS = ("documents", "packs")
NUM_BUCKETS = 24
CHUNK = 1000  # interval rows per backfill step (also bounds the IN lists)


def _big_id() -> sa.types.TypeEngine:
    return sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def _sums() -> list[sa.Column]:
    return [sa.Column(name, sa.Float(), nullable=False) for name in SUMS]


def _run_fk(table: str) -> sa.ForeignKeyConstraint:
    return sa.ForeignKeyConstraint(["run_pk"], ["runs.id"], name=op.f(f"fk_{table}_run_pk_runs"), ondelete="CASCADE")


def _create_tables() -> None:
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
    op.create_table(
        "rollups",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("level", sa.SmallInteger(), nullable=False),
        sa.Column("block", sa.Integer(), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("first_step", sa.BigInteger(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        *_sums(),
        *(sa.Column(f"{name}_{end}", sa.Float(), nullable=True) for name in BANDS for end in ("min", "max")),
        _run_fk("rollups"),
        sa.PrimaryKeyConstraint("run_pk", "level", "block", name=op.f("pk_rollups")),
    )
    op.create_table(
        "run_totals",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("last_interval", sa.Integer(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        *_sums(),
        _run_fk("run_totals"),
        sa.PrimaryKeyConstraint("run_pk", name=op.f("pk_run_totals")),
    )
    op.create_table(
        "run_sync_sites",
        sa.Column("run_pk", sa.Integer(), nullable=False),
        sa.Column("site", sa.String(length=500), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        _run_fk("run_sync_sites"),
        sa.PrimaryKeyConstraint("run_pk", "site", name=op.f("pk_run_sync_sites")),
    )


_old_histograms = sa.table(
    "interval_histograms",
    sa.column("interval_id"),
    sa.column("kind"),
    sa.column("bucket"),
    sa.column("count"),
    sa.column("tokens"),
)
_old_sites = sa.table("interval_sync_sites", sa.column("interval_id"), sa.column("site"), sa.column("count"))


def _details(connection: sa.Connection, ids: list[int]) -> dict[int, dict[str, Any]]:
    out: dict[int, dict[str, Any]] = {
        i: {
            "histograms": {k: {"count": [0] * NUM_BUCKETS, "tokens": [0] * NUM_BUCKETS} for k in KINDS},
            "sync_sites": {},
        }
        for i in ids
    }
    h = _old_histograms.c
    for interval_id, kind, bucket, count, tokens in connection.execute(
        sa.select(h.interval_id, h.kind, h.bucket, h["count"], h.tokens).where(h.interval_id.in_(ids))
    ):
        out[interval_id]["histograms"][kind]["count"][bucket] = int(count)
        out[interval_id]["histograms"][kind]["tokens"][bucket] = int(tokens)
    s = _old_sites.c
    for interval_id, site, count in connection.execute(
        sa.select(s.interval_id, s.site, s["count"]).where(s.interval_id.in_(ids))
    ):
        out[interval_id]["sync_sites"][site] = int(count)
    return out


def _backfill(connection: sa.Connection) -> None:
    # Imported here: the backfill aggregates exactly as ingest does (one implementation).
    from packscope.backend.ingest.rows import ROW_COLUMNS, row_key
    from packscope.backend.store.aggregates import store_totals
    from packscope.backend.store.models import interval_details, intervals
    from packscope.core.catalogue import Coefficients

    # The runs' columns as of this revision (Core, not the ORM model, which later revisions extend).
    runs = sa.table("runs", sa.column("id"), sa.column("model", sa.JSON), sa.column("hardware", sa.JSON))
    existing = {c["name"] for c in sa.inspect(connection).get_columns("intervals")}
    for run in connection.execute(sa.select(runs.c.id, runs.c.model, runs.c.hardware)).all():
        after = 0
        while True:
            chunk = connection.execute(
                # Columns later revisions add read as NULL: they do not exist yet at this one.
                sa.select(
                    intervals.c.id,
                    *(intervals.c[name] if name in existing else sa.null() for name in ROW_COLUMNS),
                )
                .where(intervals.c.run_pk == run.id, intervals.c.id > after)
                .order_by(intervals.c.id)
                .limit(CHUNK)
            ).all()
            if not chunk:
                break
            after = chunk[-1].id
            details = _details(connection, [r.id for r in chunk])
            connection.execute(interval_details.insert(), [{"interval_id": i, **d} for i, d in details.items()])
            sites: dict[str, int] = {}
            for d in details.values():
                for site, count in d["sync_sites"].items():
                    sites[site] = sites.get(site, 0) + count
            # Upserts add, so chunk by chunk is exact.
            rows = sorted((tuple(r)[1:] for r in chunk), key=row_key)
            store_totals(connection, run.id, Coefficients.for_run(run.model, run.hardware), rows, sites)


def upgrade() -> None:
    _create_tables()
    _backfill(op.get_bind())
    op.drop_table("interval_sync_sites")
    op.drop_table("interval_histograms")


def downgrade() -> None:
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
    connection = op.get_bind()
    details = sa.table(
        "interval_details", sa.column("interval_id"), sa.column("histograms", sa.JSON), sa.column("sync_sites", sa.JSON)
    )
    after = 0
    while True:
        chunk = connection.execute(
            sa.select(details).where(details.c.interval_id > after).order_by(details.c.interval_id).limit(CHUNK)
        ).all()
        if not chunk:
            break
        after = chunk[-1].interval_id
        buckets = [
            {"interval_id": d.interval_id, "kind": kind, "bucket": b, "count": count, "tokens": tokens}
            for d in chunk
            for kind in KINDS
            for b, (count, tokens) in enumerate(
                zip(d.histograms[kind]["count"], d.histograms[kind]["tokens"], strict=True)
            )
            if count or tokens
        ]
        sites = [{"interval_id": d.interval_id, "site": s, "count": n} for d in chunk for s, n in d.sync_sites.items()]
        if buckets:
            connection.execute(_old_histograms.insert(), buckets)
        if sites:
            connection.execute(_old_sites.insert(), sites)
    for table in ("run_sync_sites", "run_totals", "rollups", "interval_details"):
        op.drop_table(table)
