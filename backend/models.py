"""The stored schema. Alembic owns it (alembic/versions); these models must match the migrations.

One wide, typed `intervals` row per (run, rank, interval) keeps a million-interval run cheap to
aggregate in SQL; histograms and sync sites, which vary in length, live in child tables.
"""

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    UniqueConstraint,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# Deterministic constraint names, so later migrations can refer to them on every database.
NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

# SQLite only auto-increments a column declared exactly INTEGER PRIMARY KEY.
BigId = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING_CONVENTION)


class Run(Base):
    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[str] = mapped_column(String(64), unique=True)  # the client-made id
    name: Mapped[str | None] = mapped_column(String(200))
    project: Mapped[str | None] = mapped_column(String(200))
    tags: Mapped[list[str]] = mapped_column(JSON)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    model: Mapped[dict[str, Any]] = mapped_column(JSON)  # ModelSpec.to_dict(), the FLOPs model
    hardware: Mapped[dict[str, Any]] = mapped_column(JSON)
    parallel: Mapped[dict[str, Any]] = mapped_column(JSON)
    layout: Mapped[str] = mapped_column(String(8))
    status: Mapped[str] = mapped_column(String(16))
    started_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))


class Interval(Base):
    """One wire record: what `gpus` GPUs did during steps first_step..last_step."""

    __tablename__ = "intervals"
    __table_args__ = (
        # The idempotency key; `interval` before `rank` so the index also serves ordering by interval.
        UniqueConstraint("run_pk", "interval", "rank"),
        Index(None, "run_pk", "last_step"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    run_pk: Mapped[int] = mapped_column(ForeignKey("runs.id", ondelete="CASCADE"))
    interval: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(Integer)
    first_step: Mapped[int] = mapped_column(BigInteger)
    last_step: Mapped[int] = mapped_column(BigInteger)
    steps: Mapped[int] = mapped_column(Integer)
    gpus: Mapped[int] = mapped_column(Integer)
    wall_start: Mapped[float] = mapped_column(Float)
    wall_end: Mapped[float] = mapped_column(Float)
    gpu_time_s: Mapped[float] = mapped_column(Float)
    host_time_s: Mapped[float] = mapped_column(Float)
    step_time_p50_s: Mapped[float] = mapped_column(Float)
    step_time_p90_s: Mapped[float] = mapped_column(Float)
    step_time_max_s: Mapped[float] = mapped_column(Float)
    timing_lag_steps: Mapped[int] = mapped_column(Integer)
    tokens: Mapped[int] = mapped_column(BigInteger)
    real_tokens: Mapped[int] = mapped_column(BigInteger)
    packs: Mapped[int] = mapped_column(BigInteger)
    documents: Mapped[int] = mapped_column(BigInteger)
    seqlen_sq_sum_bshd: Mapped[int] = mapped_column(BigInteger)
    seqlen_sq_sum_thd: Mapped[int] = mapped_column(BigInteger)
    # The agent's own FLOPs, kept for audit; rates are re-derived from the raw sums above.
    flops_bshd: Mapped[float] = mapped_column(Float)
    flops_thd: Mapped[float] = mapped_column(Float)
    flops_useful: Mapped[float] = mapped_column(Float)
    syncs_total: Mapped[int] = mapped_column(BigInteger)
    syncs_per_iteration: Mapped[float] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float)
    lr: Mapped[float | None] = mapped_column(Float)
    grad_norm: Mapped[float | None] = mapped_column(Float)
    channel_loss: Mapped[dict[str, float] | None] = mapped_column(JSON)
    gpu_util_pct: Mapped[float | None] = mapped_column(Float)
    gpu_power_w: Mapped[float | None] = mapped_column(Float)
    gpu_sm_clock_mhz: Mapped[float | None] = mapped_column(Float)
    gpu_mem_used_bytes: Mapped[float | None] = mapped_column(Float)
    gpu_energy_j: Mapped[float | None] = mapped_column(Float)


class IntervalHistogram(Base):
    """One non-empty log2 bucket of an interval's length histogram (empty buckets are not stored)."""

    __tablename__ = "interval_histograms"
    __table_args__ = (
        UniqueConstraint("interval_id", "kind", "bucket"),
        CheckConstraint("kind IN ('documents', 'packs')", name="kind"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    interval_id: Mapped[int] = mapped_column(ForeignKey("intervals.id", ondelete="CASCADE"))
    kind: Mapped[str] = mapped_column(String(16))
    bucket: Mapped[int] = mapped_column(SmallInteger)
    count: Mapped[int] = mapped_column(BigInteger)
    tokens: Mapped[int] = mapped_column(BigInteger)


class IntervalSyncSite(Base):
    __tablename__ = "interval_sync_sites"
    __table_args__ = (UniqueConstraint("interval_id", "site"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True)
    interval_id: Mapped[int] = mapped_column(ForeignKey("intervals.id", ondelete="CASCADE"))
    site: Mapped[str] = mapped_column(String(500))
    count: Mapped[int] = mapped_column(BigInteger)
