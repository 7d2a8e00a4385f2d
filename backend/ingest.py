"""The write side: create/resume runs and store batches of interval records idempotently."""

from datetime import datetime, timezone
from typing import Any

from sqlalchemy import Table
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from packscope.core.catalogue import FIELDS
from packscope.core.histograms import KINDS

from packscope.backend.models import IntervalHistogram, IntervalSyncSite, Run, intervals
from packscope.backend.queries import get_run
from packscope.backend.schemas import (
    IngestResult,
    IntervalBatch,
    IntervalRecord,
    RunCreate,
    RunPatch,
)


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


def _interval_row(run_pk: int, r: IntervalRecord) -> dict[str, Any]:
    """The record's table row: every catalogue field, read from its place on the wire."""
    row: dict[str, Any] = {"run_pk": run_pk, "channel_loss": r.channel_loss}
    for f in FIELDS:
        value: Any = r
        for key in f.wire_path:
            value = getattr(value, key, None)
        row[f.name] = value
    return row


def _insert(session: Session, table: Table) -> postgresql.Insert | sqlite.Insert:
    # ON CONFLICT DO NOTHING has the same spelling on both backends, but lives in dialect modules.
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table)
    if dialect == "sqlite":
        return sqlite.insert(table)
    raise RuntimeError(f"unsupported database {dialect!r}; use SQLite or PostgreSQL")


def ingest_batch(session: Session, run: Run, batch: IntervalBatch) -> IngestResult:
    """Store the records whose (rank, interval) is new for `run`, in one transaction.

    A key already stored (or repeated inside the batch) counts as a duplicate and the stored row is
    left untouched, so a spool replay after a lost response never changes or doubles data.
    """
    fresh: dict[tuple[int, int], IntervalRecord] = {}
    for record in batch.intervals:
        fresh.setdefault((record.interval, record.rank), record)

    table = intervals
    stmt = (
        _insert(session, table)
        .on_conflict_do_nothing(index_elements=["run_pk", "interval", "rank"])
        .returning(table.c.id, table.c.interval, table.c.rank)
    )
    inserted = session.execute(stmt, [_interval_row(run.id, r) for r in fresh.values()]).all()

    histogram_rows: list[dict[str, Any]] = []
    site_rows: list[dict[str, Any]] = []
    for interval_id, interval, rank in inserted:
        record = fresh[(interval, rank)]
        for kind in KINDS:
            hist = getattr(record.histograms, kind)
            for bucket, (count, tokens) in enumerate(zip(hist.count, hist.tokens, strict=True)):
                if count or tokens:  # empty buckets are implied, which keeps the table small
                    histogram_rows.append(
                        {"interval_id": interval_id, "kind": kind, "bucket": bucket, "count": count, "tokens": tokens}
                    )
        site_rows += [
            {"interval_id": interval_id, "site": s.site, "count": s.count} for s in record.syncs.sites
        ]
    if histogram_rows:
        session.execute(IntervalHistogram.__table__.insert(), histogram_rows)
    if site_rows:
        session.execute(IntervalSyncSite.__table__.insert(), site_rows)
    if inserted:
        run.updated_at = _now()
    session.commit()
    return IngestResult(accepted=len(inserted), duplicates=len(batch.intervals) - len(inserted))
