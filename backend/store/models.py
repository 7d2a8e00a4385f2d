"""The stored schema. Alembic owns it (alembic/versions); these models must match the migrations.

* `intervals`: one wide, typed row per (run, rank, interval), as the agent sent it; its compact
  `interval_details` row holds the length histograms and the interval's top sync sites.
* `rollups`: the catalogue's SUMS of every aligned block of 4^level interval indexes (all ranks),
  level ≥ 1, kept at ingest, so a chart reads about max_points rows whatever the run's length.
* `channel_rollups`: the same blocks' per-channel loss sums (loss·tokens) and tokens.
* `run_totals` and `run_sync_sites`: the whole run's sums and sync sites, kept at ingest, so the
  runs list and the run page never scan a run's intervals; `run_first_interval` and
  `run_first_sync_sites` the same of its first interval, which the steady window leaves out.
* `rank_summaries`, `rank_time_buckets` and `rank_slowest`: per interval, its ranks' step times
  summed up (count, least, greatest), counted in fine log buckets (quantiles) and its slowest
  ranks, kept at ingest (store/rank_summaries.py), so the ranks panel never reads every rank;
  `interval_histogram_sums` its length histograms summed over its ranks (store/histogram_sums.py).
* `run_metric_values`: each run's derived metrics as its summary shows them, recomputed from its
  sums by the read side when its totals have changed (store/metric_values.py), so the runs list
  sorts by any in SQL.
"""

from datetime import datetime
from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
    UniqueConstraint,
    false,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from packscope.core.catalogue import BAND_METRICS, FIELDS, METRICS, SUM_NAMES, Field
from packscope.core.histograms import KINDS, NUM_BUCKETS

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
    # Edited on the runs page (PATCH /api/v1/runs/{id}); an archived run leaves the default list.
    notes: Mapped[str] = mapped_column(Text, default="", server_default="")
    archived: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    # Liveness (migration 0008): the agent's last heartbeat and the period it promised; the status
    # shown (stale, crashed) is derived from these and updated_at at read time (reads/liveness.py, shown_status).
    last_contact_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    heartbeat_s: Mapped[float | None] = mapped_column(Float)
    # What the agent found in the batches (bshd, thd, thd-static, mixed); `layout` is the declared one.
    layout_seen: Mapped[str | None] = mapped_column(String(16))
    # The pack length the baseline counted (e.g. TRL's max_length), and where it came from.
    pack_length: Mapped[int | None] = mapped_column(Integer)
    pack_length_from: Mapped[str | None] = mapped_column(String(200))
    # Whether packed documents attended to each other (kept, crossed, not checked), and the
    # sentence the agent's check wrote (migration 0018).
    cross_documents: Mapped[str | None] = mapped_column(String(16))
    cross_documents_detail: Mapped[str | None] = mapped_column(String(300))


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
    Column("channel_tokens", JSON, nullable=True),
    # The idempotency key; `interval` before `rank` so the index also serves ordering by interval.
    UniqueConstraint("run_pk", "interval", "rank"),
    Index(None, "run_pk", "last_step"),
)
# An interval row as the write path hands it around: the table's columns without the generated id.
ROW_COLUMNS = tuple(name for name in intervals.columns.keys() if name != "id")  # noqa: SIM118
COLUMN_AT = {name: i for i, name in enumerate(ROW_COLUMNS)}
FIELD_SLICE = slice(COLUMN_AT[FIELDS[0].name], COLUMN_AT[FIELDS[-1].name] + 1)  # the catalogue fields of a row


# The length histograms (packscope.core.histograms, KINDS -> {"count": [...], "tokens": [...]}) and
# the sync sites ({site: count}) of one interval row: read one interval at a time, never aggregated
# in SQL, so one JSON row each instead of a row per bucket.
interval_details = Table(
    "interval_details",
    Base.metadata,
    Column("interval_id", BigId, ForeignKey("intervals.id", ondelete="CASCADE"), primary_key=True),
    Column("histograms", JSON, nullable=False),
    Column("sync_sites", JSON, nullable=False),
)

# Rollup levels: a level-k block holds interval indexes [b·4^k, (b+1)·4^k). Level 10 blocks hold
# about a million intervals, enough for a chart of any run to read a few hundred rows at most.
ROLLUP_LEVELS = range(11)
# The levels `rollups` stores. A level-0 block is one interval merged over its ranks, which the
# reads group from `intervals` themselves (they read level 0 only over ranges of fewer than
# 4·max_points intervals, or at most 3 intervals at each end of a range), so storing it would
# double the rows every batch writes (migration 0007 deleted them).
STORED_LEVELS = range(1, 11)
# The levels `channel_rollups` stores: the same (its level 0 is summed from the interval rows'
# channel_loss and channel_tokens where a chart needs it).
CHANNEL_LEVELS = STORED_LEVELS


def _sum_columns() -> list[Column[Any]]:
    # Floats: S2 and token sums of a long run pass 2^63, and every derived number is a ratio.
    return [Column(name, Float(), nullable=False) for name in SUM_NAMES]


def _band_columns() -> list[Column[Any]]:
    # NULL where no interval of the block defines the metric (0/0).
    return [Column(f"{name}_{end}", Float(), nullable=True) for name in BAND_METRICS for end in ("min", "max")]


def _block_key() -> list[Column[Any]]:
    """(run_pk, level, block): a block of 4**level consecutive intervals of a run."""
    return [
        Column("run_pk", ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        Column("level", SmallInteger, primary_key=True, autoincrement=False),
        Column("block", Integer, primary_key=True, autoincrement=False),
    ]


rollups = Table(
    "rollups",
    Base.metadata,
    *_block_key(),
    Column("rows", BigInteger, nullable=False),  # interval rows (ranks count separately)
    Column("first_step", BigInteger, nullable=False),
    Column("last_step", BigInteger, nullable=False),
    *_sum_columns(),
    *_band_columns(),
    # The wall-clock extent of the block (unix seconds), for the time x axes; added in 0006.
    Column("wall_start_min", Float(), nullable=True),
    Column("wall_end_max", Float(), nullable=True),
)

# Per-channel loss of the same blocks: Σ mean·tokens and Σ tokens of the intervals that sent
# channel_tokens, so a point's channel loss is Σloss_sum / Σtokens, exact over intervals and ranks.
channel_rollups = Table(
    "channel_rollups",
    Base.metadata,
    *_block_key(),
    Column("channel", String(100), primary_key=True),
    Column("loss_sum", Float(), nullable=False),
    Column("tokens", Float(), nullable=False),
)

# `changed`: a stamp that grows with every write of the row, kept by the database's own trigger
# (migration 0020), never written by ingest: on PostgreSQL the writing transaction's id, on SQLite
# one more than the greatest stamp stored. Its index answers "which runs' totals changed since
# mark M?" (store/metric_values.py) without reading every run. (A batch migration that rebuilds
# the table must recreate the trigger.)
run_totals = Table(
    "run_totals",
    Base.metadata,
    Column("run_pk", ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True, autoincrement=False),
    Column("rows", BigInteger, nullable=False),
    Column("last_interval", Integer, nullable=False),
    Column("last_step", BigInteger, nullable=False),
    *_sum_columns(),
    Column("changed", BigInteger, nullable=False, server_default="0"),
    Index(None, "changed"),
)
# Columns the database writes itself (its triggers): the write statements leave them out.
STAMPED = ("changed",)

# The run's first interval (its lowest index) summed over the ranks that sent it: what the steady
# rates leave out (store/first_interval.py), one row per run however many ranks sent it. Kept at
# ingest (store/aggregates.py): a lower interval replaces it, the same one adds to it. `rows` -1:
# stored before migration 0016, whose rows the reads sum themselves.
run_first_interval = Table(
    "run_first_interval",
    Base.metadata,
    Column("run_pk", ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True, autoincrement=False),
    Column("interval", Integer, nullable=False),
    Column("rows", BigInteger, nullable=False),
    Column("first_step", BigInteger, nullable=False),
    Column("last_step", BigInteger, nullable=False),
    *_sum_columns(),
)

# The sync sites of the run's first interval (run_first_interval's), summed over its ranks: what the
# steady window's sites leave out (reads/sync_sites.py), a few rows per run however many ranks sent
# that interval. Kept at ingest (store/aggregates.py) for the interval run_first_interval holds, whose
# rows the reads take (a lower interval that replaces it deletes the higher one's). Migration 0022
# summed them from the rows of runs stored before it.
run_first_sync_sites = Table(
    "run_first_sync_sites",
    Base.metadata,
    Column("run_pk", ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("interval", Integer, primary_key=True, autoincrement=False),
    Column("site", String(500), primary_key=True),
    Column("count", BigInteger, nullable=False),
)

# The metrics the runs list sorts by that are no plain total: every catalogue metric but the amounts
# that are a sum of run_totals (those sort on run_totals itself).
KEPT_METRICS = tuple(m.name for m in METRICS if not (m.amount and m.name in SUM_NAMES))

# Each run's KEPT_METRICS as its summary shows them (rates from the steady window once it has one,
# amounts from the totals), NULL where undefined: the runs list's sort keys, a cache that a metric
# sort refreshes (store/metric_values.py). `rows`: the run_totals rows they were computed from (a
# run with more is stale); `formulas`: the fingerprint of the catalogue's formulas that computed them.
run_metric_values = Table(
    "run_metric_values",
    Base.metadata,
    Column("run_pk", ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True, autoincrement=False),
    Column("formulas", String(16), nullable=False),
    Column("rows", BigInteger, nullable=False),
    *(Column(name, Float(), nullable=True) for name in KEPT_METRICS),
    Index(None, "formulas"),  # "any row of other formulas?": one index probe
)

# The mark of the kept metrics (one row, id 1): every run whose run_totals `changed` is below
# `changed` has its run_metric_values row up to date, so a metric sort rechecks only the runs
# changed since (store/metric_values.py). Absent: every run is checked.
run_metric_values_mark = Table(
    "run_metric_values_mark",
    Base.metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("changed", BigInteger, nullable=False),
)

# Intervals that never became rows: refused by the agent (its batch input was inconsistent) or by
# the server (a 4xx); one row per (run, rank, interval), so the run page can say why it is empty.
refused_intervals = Table(
    "refused_intervals",
    Base.metadata,
    Column("run_pk", ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("rank", Integer, primary_key=True, autoincrement=False),
    Column("interval", Integer, primary_key=True, autoincrement=False),
    Column("first_step", BigInteger, nullable=False),
    Column("last_step", BigInteger, nullable=False),
    Column("refused_by", String(16), nullable=False),  # "agent" or "server"
    Column("reason", Text, nullable=False),
    Column("refused_at", DateTime(timezone=True), nullable=False),
)

run_sync_sites = Table(
    "run_sync_sites",
    Base.metadata,
    Column("run_pk", ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("site", String(500), primary_key=True),
    Column("count", BigInteger, nullable=False),
)

# Ids of deleted runs (migration 0008): writes to one are answered 410 Gone until the run is
# created again with POST /api/v1/runs?recreate=true (routes/ingest.py).
deleted_runs = Table(
    "deleted_runs",
    Base.metadata,
    Column("run_id", String(64), primary_key=True),
    Column("deleted_at", DateTime(timezone=True), nullable=False),
)


# Per interval, its ranks' step times (GPU time ÷ steps of each rank's row), kept at ingest by
# store/rank_summaries.py (migration 0016). Every column adds or widens (columns.merged_by), so
# records of one interval may arrive in any order, from any server process.
def _interval_key() -> list[Column[Any]]:
    return [
        Column("run_pk", ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        Column("interval", Integer, primary_key=True, autoincrement=False),
    ]


rank_summaries = Table(
    "rank_summaries",
    Base.metadata,
    *_interval_key(),
    Column("reporting_ranks", BigInteger, nullable=False),
    Column("last_step", BigInteger, nullable=False),
    Column("step_time_sum", Float(), nullable=False),
    Column("step_time_min", Float(), nullable=False),
    Column("step_time_max", Float(), nullable=False),
)

# The ranks of an interval counted per bucket of log2(step time) (rank_summaries.BUCKETS_PER_OCTAVE to an
# octave), with each bucket's least and greatest time: a quantile lies in one bucket, exact where
# that bucket holds one value, within the bucket's width (0.27 %) where it holds several.
rank_time_buckets = Table(
    "rank_time_buckets",
    Base.metadata,
    *_interval_key(),
    Column("bucket", Integer, primary_key=True, autoincrement=False),
    Column("ranks", BigInteger, nullable=False),
    Column("step_time_min", Float(), nullable=False),
    Column("step_time_max", Float(), nullable=False),
)

# The slowest ranks of an interval (rank_summaries.SLOWEST_KEPT of them where that many sent it;
# a few more for a moment under concurrent writers, which the reads cut).
rank_slowest = Table(
    "rank_slowest",
    Base.metadata,
    *_interval_key(),
    Column("rank", Integer, primary_key=True, autoincrement=False),
    Column("step_time_s", Float(), nullable=False),
)


# Per interval, its length histograms summed over the ranks that sent it (one column per kind,
# part and bucket), kept at ingest by store/histogram_sums.py (migration 0016), so that the
# length heatmap and the bar view read one row an interval, not one JSON document a rank.
HISTOGRAM_COLUMNS = tuple(
    f"{kind}_{part}_{b}" for kind in KINDS for part in ("count", "tokens") for b in range(NUM_BUCKETS)
)
interval_histogram_sums = Table(
    "interval_histogram_sums",
    Base.metadata,
    *_interval_key(),
    Column("rows", BigInteger, nullable=False),
    Column("first_step", BigInteger, nullable=False),
    Column("last_step", BigInteger, nullable=False),
    *(Column(name, BigInteger, nullable=False) for name in HISTOGRAM_COLUMNS),
)


# Alerts (migration 0017, docs/alerts.md): one row per alert opened; at most one open alert per
# (run, rule, subject), held by the partial unique index on the open ones, so that several server
# processes judging the same run open it once.
alerts = Table(
    "alerts",
    Base.metadata,
    Column("id", BigId, primary_key=True),
    Column("run_pk", ForeignKey("runs.id", ondelete="CASCADE"), nullable=False),
    Column("rule", String(32), nullable=False),
    Column("subject", String(500), nullable=False),  # "rank 3", a sync site, or ""
    Column("opened_at", DateTime(timezone=True), nullable=False),
    Column("resolved_at", DateTime(timezone=True), nullable=True),
    Column("summary", Text, nullable=False),
    Column("ledger_term", String(32), nullable=True),  # the loss ledger's term the rule maps to
    Column("details", JSON, nullable=False),  # the numbers that opened it
    Index("ix_alerts_open", "run_pk", "rule", "subject", unique=True,
          sqlite_where=text("resolved_at IS NULL"), postgresql_where=text("resolved_at IS NULL")),
    Index(None, "run_pk", "opened_at"),
)  # fmt: skip

# One webhook message per (alert, event, target), written in the transaction that opened or
# resolved the alert; a process claims due rows (claimed_by, with a lease) before it sends them.
alert_outbox = Table(
    "alert_outbox",
    Base.metadata,
    Column("id", BigId, primary_key=True),
    Column("alert_id", BigInteger, ForeignKey("alerts.id", ondelete="CASCADE"), nullable=False),
    Column("event", String(16), nullable=False),  # "opened" or "resolved"
    Column("target", String(2000), nullable=False),  # the webhook URL
    Column("body", Text, nullable=False),  # the exact bytes signed and sent, the same at every retry
    Column("created_at", DateTime(timezone=True), nullable=False),
    Column("next_attempt_at", DateTime(timezone=True), nullable=False),
    Column("attempts", Integer, nullable=False),
    Column("claimed_by", String(64), nullable=True),
    Column("claim_expires_at", DateTime(timezone=True), nullable=True),
    Column("sent_at", DateTime(timezone=True), nullable=True),
    Column("last_error", Text, nullable=True),
    UniqueConstraint("alert_id", "event", "target"),
    Index(None, "sent_at", "next_attempt_at"),
)

# Thresholds and webhooks set through the API: project "" holds the server-wide ones.
alert_settings = Table(
    "alert_settings",
    Base.metadata,
    Column("project", String(200), primary_key=True),
    Column("settings", JSON, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False),
)

# The intervals whose loss arrived NaN or ±inf: the interval row stores such a loss as missing,
# which alone could not tell a diverged loss from one never sent.
nonfinite_losses = Table(
    "nonfinite_losses",
    Base.metadata,
    Column("run_pk", ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
    Column("interval", Integer, primary_key=True, autoincrement=False),
    Column("rank", Integer, primary_key=True, autoincrement=False),
)
