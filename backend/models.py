"""The stored schema. Alembic owns it (alembic/versions); these models must match the migrations.

One wide, typed `intervals` row per (run, rank, interval) keeps a million-interval run cheap to
aggregate in SQL; histograms and sync sites, which vary in length, live in child tables.
"""

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    Column,
    Table,
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

from packscope.core.catalogue import FIELDS, Field

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


def _catalogue_column(f: Field) -> Column[Any]:
    if f.kind == "float":
        kind: Any = Float()
    else:
        kind = Integer() if f.small else BigInteger()
    return Column(f.name, kind, nullable=not f.required)


# One wire record: what `gpus` GPUs did during steps first_step..last_step. Its scalar columns
# come from the catalogue (packscope/core/catalogue.py), in the catalogue's order.
intervals = Table(
    "intervals",
    Base.metadata,
    Column("id", BigId, primary_key=True),
    Column("run_pk", ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    *(_catalogue_column(f) for f in FIELDS),
    Column("channel_loss", JSON, nullable=True),
    # The idempotency key; `interval` before `rank` so the index also serves ordering by interval.
    UniqueConstraint("run_pk", "interval", "rank"),
    Index(None, "run_pk", "last_step"),
)


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
