"""The write side: create/resume runs and store batches of interval records idempotently.

A batch is one transaction: the new interval rows (ON CONFLICT DO NOTHING RETURNING tells which
are new), their details, and the rollups, run totals and run sync sites that only the new rows
feed, each upserted once per touched key so a replay never double-counts.
"""

import json
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from packscope.backend.aggregates import store_aggregates
from packscope.backend.models import Run
from packscope.backend.queries import coefficients, get_run
from packscope.backend.rows import Key, interval_row, sync_sites_of
from packscope.backend.schemas import IngestResult, IntervalRecord, RunCreate, RunPatch
from packscope.backend.writes import write


class ModelConflict(Exception):
    """A resume sent a different FLOPs model than the one stored with the run."""


def _now() -> datetime:
    return datetime.now(UTC)


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
    if body.status is None:  # RunPatch also carries edits without a status (routes/ingest.update_run)
        return run
    run.status = body.status
    run.ended_at = None if body.status == "running" else (body.ended_at or now)
    run.updated_at = now
    session.commit()
    return run


# -- one batch ------------------------------------------------------------------------------------
def ingest_batch(session: Session, run: Run, records: Iterable[IntervalRecord]) -> IngestResult:
    """Store the records whose (rank, interval) is new for `run`, in one transaction.

    A key already stored (or repeated inside the batch) counts as a duplicate and the stored row is
    left untouched, so a spool replay after a lost response never changes or doubles data.
    """
    fresh: dict[Key, IntervalRecord] = {}
    received = 0
    for record in records:
        received += 1
        fresh.setdefault((getattr(record, "interval"), getattr(record, "rank")), record)  # noqa: B009 - generated fields
    rows = {key: interval_row(run.id, r) for key, r in fresh.items()}
    details = {key: (r.histograms.model_dump_json(), sync_sites_of(r)) for key, r in fresh.items()}
    inserted = insert_rows(session, run, rows, details)
    session.commit()
    return IngestResult(accepted=inserted, duplicates=received - inserted)


def insert_rows(
    session: Session,
    run: Run,
    rows: Mapping[Key, Sequence[Any]],
    details: Mapping[Key, tuple[str, Mapping[str, int]]],
) -> int:
    """Insert interval rows (ROW_COLUMNS tuples keyed (interval, rank)) with their details
    (histograms as JSON text, sync sites); feed only the new ones to the aggregates. Returns how
    many were new. The caller commits."""
    if not rows:
        return 0
    connection = session.connection()
    ordered = [rows[key] for key in sorted(rows)]  # concurrent batches take index locks in one order
    inserted = write(connection, "intervals", "insert_new", ordered)
    new_ids = {(interval, rank): interval_id for interval_id, interval, rank in inserted}
    if not new_ids:
        return 0
    new_keys = sorted(new_ids)
    sites: dict[str, int] = {}
    for key in new_keys:
        for site, count in details[key][1].items():
            sites[site] = sites.get(site, 0) + count
    new_details = [(new_ids[key], details[key][0], json.dumps(details[key][1])) for key in new_keys]
    write(connection, "interval_details", "insert", new_details)
    store_aggregates(connection, run.id, coefficients(run), [rows[key] for key in new_keys], sites)
    session.execute(update(Run).where(Run.id == run.id).values(updated_at=_now()))
    return len(new_ids)
