"""The write side: create/resume runs and store batches of interval records idempotently.

A batch is one transaction: the new interval rows (ON CONFLICT DO NOTHING RETURNING tells which
are new), their details, and the rollups, run totals and run sync sites that only the new rows
feed, each upserted once per touched key so a replay never double-counts.
"""

from datetime import datetime, timezone
import functools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy import ColumnElement, Table, func, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from packscope.core.catalogue import BAND_METRICS, FIELDS, SUM_NAMES, Coefficients, interval_rates, sums_of_rows
from packscope.core.histograms import KINDS

from packscope.backend.models import ROLLUP_LEVELS, Run, interval_details, intervals, rollups, run_sync_sites, run_totals
from packscope.backend.queries import coefficients, get_run
from packscope.backend.schemas import IngestResult, IntervalRecord, RunCreate, RunPatch


class ModelConflict(Exception):
    """A resume sent a different FLOPs model than the one stored with the run."""


def _now() -> datetime:
    return datetime.now(timezone.utc)


def create_or_resume_run(session: Session, body: RunCreate) -> tuple[Run, bool]:
    """(run, created). A resume keeps the stored run and marks it running again."""
    model = body.model.to_dict()
    run = get_run(session, body.run_id)
    if run is None:
        now = _now()
        run = Run(
            run_id=body.run_id,
            name=body.name,
            project=body.project,
            tags=body.tags,
            config=body.config,
            model=model,
            hardware=body.hardware.model_dump(),
            parallel=body.parallel,
            layout=body.layout,
            status="running",
            started_at=body.started_at or now,
            ended_at=None,
            created_at=now,
            updated_at=now,
        )
        session.add(run)
        try:
            session.commit()
            return run, True
        except IntegrityError:  # another request created it first: this one is a resume
            session.rollback()
            run = get_run(session, body.run_id)
            assert run is not None
    if run.model != model:
        changed = sorted(k for k in model if run.model.get(k) != model[k])
        raise ModelConflict(
            f"run {body.run_id!r} is stored with a different model (fields differ: "
            f"{', '.join(changed)}); the FLOPs of one run must use one model, so start a new run_id"
        )
    # A second POST means the trainer (re)started with this run_id.
    run.status, run.ended_at, run.updated_at = "running", None, _now()
    session.commit()
    return run, False


def patch_run(session: Session, run: Run, body: RunPatch) -> Run:
    now = _now()
    run.status = body.status
    run.ended_at = None if body.status == "running" else (body.ended_at or now)
    run.updated_at = now
    session.commit()
    return run


# -- rows of a batch -------------------------------------------------------------------------------
_WIRE_PATHS = tuple((f.name, f.wire_path) for f in FIELDS)


def interval_row(run_pk: int, r: IntervalRecord) -> dict[str, Any]:
    """The record's table row: every catalogue field, read from its place on the wire."""
    row: dict[str, Any] = {"run_pk": run_pk, "channel_loss": r.channel_loss}
    for name, path in _WIRE_PATHS:
        value: Any = r
        for key in path:
            value = getattr(value, key, None)
        row[name] = value
    return row


def details_row(r: IntervalRecord) -> dict[str, Any]:
    """What `interval_details` keeps of a record, without its interval_id."""
    return {
        "histograms": {k: {"count": getattr(r.histograms, k).count, "tokens": getattr(r.histograms, k).tokens} for k in KINDS},
        "sync_sites": {s.site: s.count for s in r.syncs.sites},
    }


# -- rollups and totals, aggregated in Python before one upsert per key ---------------------------
_BAND_COLUMNS = tuple((name, f"{name}_min", f"{name}_max") for name in BAND_METRICS)


def _block_of(rows: Sequence[Mapping[str, Any]], c: Coefficients) -> dict[str, Any]:
    """The level-0 block of one interval: its rows' (all ranks') sums, steps and band extremes."""
    block: dict[str, Any] = {
        "rows": len(rows),
        "first_step": min(r["first_step"] for r in rows),
        "last_step": max(r["last_step"] for r in rows),
        **sums_of_rows(rows),
    }
    rates = [interval_rates(r, c) for r in rows]
    for name, low, high in _BAND_COLUMNS:
        values = [v[name] for v in rates if v[name] is not None]
        block[low], block[high] = (min(values), max(values)) if values else (None, None)
    return block


def _merge_into(target: dict[str, Any], block: Mapping[str, Any]) -> None:
    """Add `block` to `target`: counts and sums add, steps and bands widen."""
    target["rows"] += block["rows"]
    target["first_step"] = min(target["first_step"], block["first_step"])
    target["last_step"] = max(target["last_step"], block["last_step"])
    for name in SUM_NAMES:
        target[name] += block[name]
    for _, low, high in _BAND_COLUMNS:
        if block[low] is not None:
            target[low] = block[low] if target[low] is None else min(target[low], block[low])
            target[high] = block[high] if target[high] is None else max(target[high], block[high])


class Aggregates:
    """The rollup blocks, run totals and run sync sites that a set of new interval rows adds to."""

    def __init__(self, c: Coefficients) -> None:
        self.c = c
        self.rows_by_interval: dict[int, list[Mapping[str, Any]]] = {}
        self.sync_sites: dict[str, int] = {}

    def add(self, row: Mapping[str, Any], sync_sites: Mapping[str, int]) -> None:
        self.rows_by_interval.setdefault(row["interval"], []).append(row)
        for site, count in sync_sites.items():
            self.sync_sites[site] = self.sync_sites.get(site, 0) + count

    def blocks(self) -> dict[tuple[int, int], dict[str, Any]]:
        """(level, block) -> aggregate; each level is built from the one below, not from rows."""
        level_blocks = {i: _block_of(rows, self.c) for i, rows in self.rows_by_interval.items()}
        out = {(0, i): b for i, b in level_blocks.items()}
        for level in ROLLUP_LEVELS[1:]:
            coarser: dict[int, dict[str, Any]] = {}
            for index, block in sorted(level_blocks.items()):
                parent = coarser.get(index >> 2)
                if parent is None:
                    coarser[index >> 2] = dict(block)
                else:
                    _merge_into(parent, block)
            level_blocks = coarser
            out.update(((level, i), b) for i, b in level_blocks.items())
        return out

    def store(self, session: Session, run_pk: int) -> None:
        """Add these aggregates to the stored ones. Keys are written in sorted order, so concurrent
        batches of one run lock rows in the same order and cannot deadlock."""
        if not self.rows_by_interval:
            return
        blocks = self.blocks()
        dialect = session.get_bind().dialect.name
        session.execute(
            _upsert_adding(dialect, "rollups"),
            [{"run_pk": run_pk, "level": level, "block": block, **agg} for (level, block), agg in sorted(blocks.items())],
        )
        tops = [agg for (level, _), agg in blocks.items() if level == ROLLUP_LEVELS[-1]]  # cover every row once
        totals = {name: sum(agg[name] for agg in tops) for name in ("rows", *SUM_NAMES)}
        totals.update(last_interval=max(self.rows_by_interval), last_step=max(agg["last_step"] for agg in tops))
        session.execute(_upsert_adding(dialect, "run_totals"), [{"run_pk": run_pk, **totals}])
        if self.sync_sites:
            sites = [{"run_pk": run_pk, "site": site, "count": n} for site, n in sorted(self.sync_sites.items())]
            session.execute(_upsert_adding(dialect, "run_sync_sites"), sites)


def _insert(dialect: str, table: Table) -> postgresql.Insert | sqlite.Insert:
    # ON CONFLICT has the same spelling on both backends, but lives in dialect modules.
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"unsupported database {dialect!r}; use SQLite or PostgreSQL")


_AGGREGATE_TABLES = {t.name: t for t in (rollups, run_totals, run_sync_sites)}


@functools.cache
def _upsert_adding(dialect: str, table_name: str) -> Any:
    """INSERT … ON CONFLICT (primary key) DO UPDATE: counts and sums add, steps and bands widen.
    Built once per dialect and table: building it costs more than running it."""
    table = _AGGREGATE_TABLES[table_name]
    key = [c.name for c in table.primary_key.columns]
    stmt = _insert(dialect, table)
    least, greatest = (func.least, func.greatest) if dialect == "postgresql" else (func.min, func.max)

    def widen(pick: Any, stored: ColumnElement[Any], new: ColumnElement[Any]) -> ColumnElement[Any]:
        return func.coalesce(pick(stored, new), stored, new)  # SQLite's min(x, NULL) is NULL

    changes: dict[str, Any] = {}
    for column in table.columns:
        stored, new = column, stmt.excluded[column.name]
        if column.name in key:
            continue
        if column.name.endswith("_min") or column.name == "first_step":
            changes[column.name] = widen(least, stored, new)
        elif column.name.endswith("_max") or column.name in ("last_step", "last_interval"):
            changes[column.name] = widen(greatest, stored, new)
        else:
            changes[column.name] = stored + new
    return stmt.on_conflict_do_update(index_elements=key, set_=changes)


# -- one batch ------------------------------------------------------------------------------------
def ingest_batch(session: Session, run: Run, records: Iterable[IntervalRecord]) -> IngestResult:
    """Store the records whose (rank, interval) is new for `run`, in one transaction.

    A key already stored (or repeated inside the batch) counts as a duplicate and the stored row is
    left untouched, so a spool replay after a lost response never changes or doubles data.
    """
    fresh: dict[tuple[int, int], IntervalRecord] = {}
    received = 0
    for record in records:
        received += 1
        fresh.setdefault((record.interval, record.rank), record)
    rows = {key: interval_row(run.id, r) for key, r in fresh.items()}
    inserted = insert_rows(session, run, rows, {key: details_row(r) for key, r in fresh.items()})
    session.commit()
    return IngestResult(accepted=inserted, duplicates=received - inserted)


def insert_rows(
    session: Session,
    run: Run,
    rows: Mapping[tuple[int, int], dict[str, Any]],
    details: Mapping[tuple[int, int], dict[str, Any]],
) -> int:
    """Insert interval rows keyed (interval, rank) with their details; feed only the new ones to
    the aggregates. Returns how many were new. The caller commits."""
    if not rows:
        return 0
    stmt = (
        _insert(session.get_bind().dialect.name, intervals)
        .on_conflict_do_nothing(index_elements=["run_pk", "interval", "rank"])
        .returning(intervals.c.id, intervals.c.interval, intervals.c.rank)
    )
    inserted = session.execute(stmt, list(rows.values())).all()
    if not inserted:
        return 0
    aggregates = Aggregates(coefficients(run))
    new_details = []
    for interval_id, interval, rank in inserted:
        detail = details[(interval, rank)]
        new_details.append({"interval_id": interval_id, **detail})
        aggregates.add(rows[(interval, rank)], detail["sync_sites"])
    session.execute(interval_details.insert(), new_details)
    aggregates.store(session, run.id)
    session.execute(update(Run).where(Run.id == run.id).values(updated_at=_now()))
    return len(inserted)
