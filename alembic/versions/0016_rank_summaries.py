"""Per-interval summaries of the ranks' step times, kept at ingest so the ranks panel reads a few
rows per interval whatever the number of ranks (issue 39): `rank_summaries` (ranks reporting, Σ,
least and greatest step time, last step), `rank_time_buckets` (ranks per bucket of log2 step time,
256 to an octave, with each bucket's least and greatest time) and `rank_slowest` (the 8 slowest
ranks of each interval); and `run_first_interval`, a run's first interval summed over its ranks
(what the steady rates leave out), one row per run instead of its every rank's rows; and
`interval_histogram_sums`, an interval's length histograms summed over its ranks.

Frozen: the backfill is this file's own code, over the stored interval rows read in key order,
one interval at a time (the same arithmetic as backend/store/rank_summaries.py at this revision).
A run already stored gets a first-interval row marked rows = -1 (the reads sum that interval's rows
themselves, as before), which only a lower interval replaces. The interval histograms are summed
here from the stored JSON, one interval at a time.

Revision ID: 0016
Revises: 0014
Create Date: 2026-12-06
"""

import json
import math
from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

BUCKETS_PER_OCTAVE = 256
SLOWEST_KEPT = 8
ZERO_BUCKET = -(2**31)
KINDS, PARTS, BUCKETS = ("documents", "packs"), ("count", "tokens"), 24
HISTOGRAM_COLUMNS = tuple(f"{kind}_{part}_{b}" for kind in KINDS for part in PARTS for b in range(BUCKETS))
# The run totals' sums at this revision (the catalogue's SUMS, written out: migrations are frozen).
SUM_NAMES = (
    "steps", "rank_steps", "gpu_time_s", "gpu_seconds", "tokens", "real_tokens", "seqlen_sq_sum_bshd",
    "seqlen_sq_sum_thd", "window_sq_sum_bshd", "window_sq_sum_thd", "chunk_sq_sum_bshd", "chunk_sq_sum_thd",
    "vision_images", "vision_patches", "vision_sq_sum", "vision_window_sq_sum", "documents", "packs",
    "syncs_total", "syncs_uncounted_steps", "step_p50_x_steps", "step_p90_x_steps", "loss_x_tokens",
    "loss_tokens", "lr_x_steps", "lr_steps", "grad_norm_x_steps", "grad_norm_steps", "gpu_util_x_s",
    "gpu_util_s", "gpu_power_x_s", "gpu_power_s", "gpu_clock_x_s", "gpu_clock_s", "gpu_mem_x_s", "gpu_mem_s",
    "gpu_energy_j", "energy_tokens", "data_wait_s", "data_wait_gaps", "traced_steps", "traced_step_time_s",
    "traced_busy_s", "sync_idle_s", "launch_idle_s",
)  # fmt: skip


def _key() -> list[sa.Column]:
    return [
        sa.Column("run_pk", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("interval", sa.Integer(), primary_key=True, autoincrement=False),
    ]


def _bucket(t: float) -> int:
    return math.floor(math.log2(t) * BUCKETS_PER_OCTAVE) if t > 0 else ZERO_BUCKET


def upgrade() -> None:
    summaries = op.create_table(
        "rank_summaries",
        *_key(),
        sa.Column("reporting_ranks", sa.BigInteger(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        sa.Column("step_time_sum", sa.Float(), nullable=False),
        sa.Column("step_time_min", sa.Float(), nullable=False),
        sa.Column("step_time_max", sa.Float(), nullable=False),
    )
    buckets = op.create_table(
        "rank_time_buckets",
        *_key(),
        sa.Column("bucket", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("ranks", sa.BigInteger(), nullable=False),
        sa.Column("step_time_min", sa.Float(), nullable=False),
        sa.Column("step_time_max", sa.Float(), nullable=False),
    )
    slowest = op.create_table(
        "rank_slowest",
        *_key(),
        sa.Column("rank", sa.Integer(), primary_key=True, autoincrement=False),
        sa.Column("step_time_s", sa.Float(), nullable=False),
    )
    _backfill(summaries, buckets, slowest)
    op.create_table(
        "run_first_interval",
        sa.Column("run_pk", sa.Integer(), sa.ForeignKey("runs.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("interval", sa.Integer(), nullable=False),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("first_step", sa.BigInteger(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        *(sa.Column(name, sa.Float(), nullable=False) for name in SUM_NAMES),
    )
    histograms = op.create_table(
        "interval_histogram_sums",
        *_key(),
        sa.Column("rows", sa.BigInteger(), nullable=False),
        sa.Column("first_step", sa.BigInteger(), nullable=False),
        sa.Column("last_step", sa.BigInteger(), nullable=False),
        *(sa.Column(name, sa.BigInteger(), nullable=False) for name in HISTOGRAM_COLUMNS),
    )
    _backfill_histogram_sums(histograms)
    op.execute(
        f"INSERT INTO run_first_interval (run_pk, interval, rows, first_step, last_step, {', '.join(SUM_NAMES)}) "
        f"SELECT run_pk, min(interval), -1, 0, 0{', 0' * len(SUM_NAMES)} FROM intervals GROUP BY run_pk"
    )


def _backfill_histogram_sums(table: sa.Table) -> None:
    bind = op.get_bind()
    rows = bind.execute(
        sa.text(
            "SELECT i.run_pk, i.interval, i.first_step, i.last_step, d.histograms FROM intervals i "
            "JOIN interval_details d ON d.interval_id = i.id ORDER BY i.run_pk, i.interval"
        )
    )
    out: list[dict] = []
    key: tuple[int, int] | None = None
    kept: dict = {}
    for run_pk, interval, first_step, last_step, stored in rows:
        h = json.loads(stored) if isinstance(stored, str) else stored
        numbers = [int(n) for kind in KINDS for part in PARTS for n in h[kind][part]]
        if (run_pk, interval) != key:
            if kept:
                out.append(kept)
            if len(out) >= 5_000:
                bind.execute(table.insert(), out)
                out = []
            key = (run_pk, interval)
            kept = {"run_pk": run_pk, "interval": interval, "rows": 0, "first_step": first_step,
                    "last_step": last_step, **dict.fromkeys(HISTOGRAM_COLUMNS, 0)}  # fmt: skip
        kept["rows"] += 1
        kept["first_step"] = min(kept["first_step"], first_step)
        kept["last_step"] = max(kept["last_step"], last_step)
        for name, n in zip(HISTOGRAM_COLUMNS, numbers, strict=True):
            kept[name] += n
    if kept:
        out.append(kept)
    if out:
        bind.execute(table.insert(), out)


def _backfill(summaries: sa.Table, buckets: sa.Table, slowest: sa.Table) -> None:
    bind = op.get_bind()
    rows = bind.execute(
        sa.text(
            "SELECT run_pk, interval, rank, last_step, gpu_time_s, steps FROM intervals ORDER BY run_pk, interval, rank"
        )
    )
    out: dict[str, list[dict]] = {"summaries": [], "buckets": [], "slowest": []}

    def flush(key: tuple[int, int], members: list[tuple[int, int, float]]) -> None:
        run_pk, interval = key
        times = [t for _, _, t in members]
        out["summaries"].append(
            {
                "run_pk": run_pk,
                "interval": interval,
                "reporting_ranks": len(members),
                "last_step": max(s for _, s, _ in members),
                "step_time_sum": sum(times),
                "step_time_min": min(times),
                "step_time_max": max(times),
            }
        )
        counted: dict[int, list[float]] = {}
        for t in times:
            kept = counted.setdefault(_bucket(t), [0, t, t])
            kept[0] += 1
            kept[1], kept[2] = min(kept[1], t), max(kept[2], t)
        out["buckets"] += [
            {"run_pk": run_pk, "interval": interval, "bucket": b, "ranks": n, "step_time_min": lo, "step_time_max": hi}
            for b, (n, lo, hi) in sorted(counted.items())
        ]
        top = sorted(((t, rank) for rank, _, t in members), key=lambda tr: (-tr[0], tr[1]))[:SLOWEST_KEPT]
        out["slowest"] += [{"run_pk": run_pk, "interval": interval, "rank": r, "step_time_s": t} for t, r in top]

    def write() -> None:
        for table, name in ((summaries, "summaries"), (buckets, "buckets"), (slowest, "slowest")):
            if out[name]:
                bind.execute(table.insert(), out[name])
            out[name] = []

    key: tuple[int, int] | None = None
    members: list[tuple[int, int, float]] = []
    for run_pk, interval, rank, last_step, gpu_time_s, steps in rows:
        if (run_pk, interval) != key:
            if key is not None:
                flush(key, members)
                if len(out["buckets"]) > 10_000:
                    write()
            key, members = (run_pk, interval), []
        members.append((int(rank), int(last_step), float(gpu_time_s) / float(steps)))
    if key is not None:
        flush(key, members)
    write()


def downgrade() -> None:
    for table in (
        "interval_histogram_sums",
        "run_first_interval",
        "rank_slowest",
        "rank_time_buckets",
        "rank_summaries",
    ):
        op.drop_table(table)
