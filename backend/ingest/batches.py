"""The write side: create/resume runs and store batches of interval records idempotently.

A batch is one transaction: the new interval rows (ON CONFLICT DO NOTHING RETURNING tells which
are new), their details, and the rollups, run totals, run sync sites, rank summaries and
interval histograms that only the new rows feed, each upserted once per touched key so a replay never double-counts.
"""

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any, cast

import msgspec
from sqlalchemy import Connection, Engine, Table, insert
from sqlalchemy.dialects import sqlite
from sqlalchemy.dialects.postgresql.psycopg import PGDialect_psycopg
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from packscope.backend.api.schemas import IngestResult, RunCreate, RunPatch
from packscope.backend.ingest.rows import Parsed, parsed_records
from packscope.backend.store.aggregates import store_aggregates
from packscope.backend.store.db import run_sql
from packscope.backend.store.histogram_sums import interval_sums
from packscope.backend.store.models import Run, nonfinite_losses
from packscope.backend.store.rank_summaries import keep_slowest, rank_writes
from packscope.backend.store.runs import coefficients, get_run
from packscope.backend.store.writes import driver_of, insert_intervals
from packscope.core.catalogue import INT64_MAX, Coefficients

_SITES = msgspec.json.Encoder()  # {site: count} as interval_details stores it


class ModelConflict(Exception):
    """A resume sent a different FLOPs model than the one stored with the run."""


def _now() -> datetime:
    return datetime.now(UTC)


def create_or_resume_run(session: Session, body: RunCreate, restart: bool = True) -> tuple[Run, bool]:
    """(run, created). A resume keeps the stored run and, when the trainer restarted (`restart`),
    marks it running again; a sender that is not the trainer (sync, import) leaves its status."""
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
    if restart:  # a second POST from the trainer means it (re)started with this run_id
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
_RUNS = cast(Table, Run.__table__)
# The run of a batch in the driver's own SQL (db.run_sql: nothing compiled per call). The model
# and hardware come as their JSON text, the key of their cached coefficients. PostgreSQL: FOR KEY
# SHARE holds off a DELETE of the run until the batch commits, and waits for one in progress (then
# finds no run: 410), where the rows' foreign key would meet the deleted run. SQLite's writes are
# serialised already.
_RUN_OF_ID = {
    "sqlite": "SELECT id, model, hardware FROM runs WHERE run_id = ?",
    "postgresql": "SELECT id, model::text, hardware::text FROM runs WHERE run_id = %s FOR KEY SHARE",
}


@functools.cache
def _as_stored_time(database: str) -> Callable[[datetime], Any]:
    """A datetime as SQLAlchemy's DateTime column binds it for this database (SQLite: its text)."""
    dialect = {"sqlite": sqlite.dialect, "postgresql": PGDialect_psycopg}[database]()
    process = _RUNS.c.updated_at.type.dialect_impl(dialect).bind_processor(dialect)
    return process or (lambda value: value)


Batch = tuple[str, Parsed]  # (run_id, its validated records)


def ingest_together(engine: Engine, batches: Sequence[Batch]) -> list[IngestResult | None]:
    """Store several parsed batches (of one run or several) in one transaction, each answered as if
    the batches had been stored one after another in this order: a record whose key an earlier
    batch (or an earlier record) holds counts as that batch's duplicate. None for a batch whose run
    is not stored. The aggregates are written once per run for all of them, which is what makes a
    burst of small batches cheap (see routes/ingest.py)."""
    results: list[IngestResult | None] = [None] * len(batches)
    by_run: dict[str, list[int]] = {}
    for i, (run_id, _) in enumerate(batches):
        by_run.setdefault(run_id, []).append(i)
    with engine.begin() as connection:
        database = driver_of(connection)
        select_run = _RUN_OF_ID[database]
        for run_id in sorted(by_run):  # concurrent transactions lock runs in one order
            found = run_sql(connection, select_run, (run_id,))
            if not found:
                continue
            run_pk, model, hardware = found[0]
            members = by_run[run_id]
            parts = [batches[i][1] for i in members]
            together = parts[0] if len(parts) == 1 else Parsed.joined(parts)
            owners = [i for i in members for _ in range(len(batches[i][1]))]
            stored = _store(connection, run_pk, Coefficients.of_json(model, hardware), together)
            accepted = dict.fromkeys(members, 0)
            for at in stored:
                accepted[owners[at]] += 1
            for i in members:
                batch = batches[i][1]
                results[i] = IngestResult(
                    accepted=accepted[i], duplicates=len(batch) - accepted[i], ignored=batch.ignored
                )
    return results


def ingest_batch(session: Session, run: Run, records: Iterable[Mapping[str, Any]]) -> IngestResult:
    """Store records built in Python (dicts, as the wire carries them) for `run`, with the same
    checks as the HTTP route (record.RecordError), and commit the session."""
    listed = list(records)
    if not listed:
        return IngestResult(accepted=0, duplicates=0)
    result = store_records(session.connection(), run.id, coefficients(run), parsed_records(listed))
    session.commit()
    return result


def store_records(connection: Connection, run_pk: int, c: Coefficients, parsed: Parsed) -> IngestResult:
    """Store the checked records whose (rank, interval) is new for the run; feed only the new ones
    to the aggregates. The caller commits.

    A key already stored (or repeated inside the batch) counts as a duplicate and the stored row is
    left untouched, so a spool replay after a lost response never changes or doubles data.
    """
    accepted = len(_store(connection, run_pk, c, parsed))
    return IngestResult(accepted=accepted, duplicates=len(parsed) - accepted, ignored=parsed.ignored)


def _summed_sites(per_row: Iterable[Mapping[str, int]], start: Mapping[str, int] | None = None) -> dict[str, int]:
    """Each site's count over the rows (added to `start`'s), stopping at INT64_MAX as the stored
    sums do (every count is >= 0)."""
    out = dict(start or {})
    counted = out.get
    for sites in per_row:
        for site, n in sites.items():
            out[site] = counted(site, 0) + n
    for site, n in out.items():
        if n > INT64_MAX:
            out[site] = INT64_MAX
    return out


def _store(connection: Connection, run_pk: int, c: Coefficients, parsed: Parsed) -> list[int]:
    """store_records' work; the positions in `parsed` of the records stored."""
    keys = parsed.keys()
    count = len(keys)
    # The first position of each key (a later one is a duplicate): assigned from the last to the
    # first, so the first one stays.
    first = dict(zip(reversed(keys), range(count - 1, -1, -1), strict=True))
    ordered = sorted(first)  # concurrent batches take index locks in one order
    at = list(map(first.__getitem__, ordered))
    values, histograms, sites = parsed.values, parsed.histograms, parsed.sites
    rows = [(run_pk, *values[i]) for i in at]
    encode = _SITES.encode
    details = [(histograms[i], encode(sites[i]).decode()) for i in at]
    now = _as_stored_time(driver_of(connection))(_now())
    inserted = insert_intervals(connection, rows, details, run_pk, now)
    if not inserted:
        return []
    if len(inserted) == len(ordered):  # every key was new (the usual batch)
        new = list(range(len(ordered)))
    else:
        new_ids = {(interval, rank) for _, interval, rank in inserted}
        new = [k for k, key in enumerate(ordered) if key in new_ids]  # still in key order
    # The new rows of the batch's lowest interval come first (key order): their sites are that
    # interval's share of the run's first-interval sites, should it be the run's first.
    lowest = ordered[new[0]][0]
    split = next((j for j, k in enumerate(new) if ordered[k][0] != lowest), len(new))
    lowest_sites = _summed_sites(sites[at[k]] for k in new[:split])
    run_sites = lowest_sites if split == len(new) else _summed_sites((sites[at[k]] for k in new[split:]), lowest_sites)
    channels = [parsed.channels[at[k]] for k in new]
    new_rows = [rows[k] for k in new]
    ranks, slowest = rank_writes(run_pk, new_rows)
    lengths = (
        "interval_histogram_sums",
        interval_sums(run_pk, new_rows, [parsed.histogram_counts[at[k]] for k in new]),
    )
    store_aggregates(
        connection, run_pk, c, new_rows, run_sites, channels, also=[*ranks, lengths], lowest_sites=lowest_sites
    )
    keep_slowest(connection, run_pk, slowest)
    if parsed.nonfinite_loss:  # rare: a diverged loss, kept for the nonfinite_loss alert
        stored = {at[k] for k in new}
        diverged = [keys[i] for i in parsed.nonfinite_loss if i in stored]
        if diverged:
            connection.execute(
                insert(nonfinite_losses), [{"run_pk": run_pk, "interval": i, "rank": r} for i, r in diverged]
            )
    return [at[k] for k in new]
