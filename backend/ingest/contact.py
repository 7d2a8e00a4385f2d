"""What a run's agent tells the server beside its interval records: that it is alive (heartbeats),
the layout it found in the batches, and the intervals it could not send (refusals).

The request bodies live here with the writes they feed; routes/ingest.py only routes them. The
read side is backend/reads/liveness.py (the status shown) and backend/reads/summaries.py (the refusal counts).
"""

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field
from sqlalchemy import insert
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.orm import Session

from packscope.backend.api.schemas import RunPatch, SafeStr, whole_number
from packscope.backend.store.models import Run, refused_intervals
from packscope.core.catalogue import INT32_MAX, INT64_MAX

MAX_REASON = 1000  # characters of a refusal's reason that are kept


class Heartbeat(BaseModel):
    """POST /api/v1/runs/{run_id}/heartbeat: the agent is alive and promises the next beat within
    `every_s` seconds (its records count as contact too)."""

    # strict: a JSON number (30 or 30.5), not "30" or true
    every_s: Annotated[float, Field(strict=True, gt=0, le=86_400, allow_inf_nan=False)] = 30.0


class Refusal(BaseModel):
    # JSON numbers only: true, false or "3" is no interval (lax pydantic took them as 1, 0 and 3)
    interval: whole_number(0, INT32_MAX)  # type: ignore[valid-type]
    rank: whole_number(0, INT32_MAX) = 0  # type: ignore[valid-type]
    first_step: whole_number(0, INT64_MAX)  # type: ignore[valid-type]
    last_step: whole_number(0, INT64_MAX)  # type: ignore[valid-type]
    by: Literal["agent", "server"]  # who refused it: the agent (bad batch input) or the server (4xx)
    reason: SafeStr = Field(max_length=10 * MAX_REASON)


class Refusals(BaseModel):
    """POST /api/v1/runs/{run_id}/refusals: intervals that will never be stored, and why."""

    refusals: list[Refusal] = Field(min_length=1, max_length=1000)


def _now() -> datetime:
    return datetime.now(UTC)


def record_heartbeat(session: Session, run: Run, beat: Heartbeat) -> None:
    run.last_contact_at = _now()
    run.heartbeat_s = beat.every_s
    session.commit()


def apply_layout(run: Run, patch: RunPatch) -> None:
    """The layout fields of a PATCH (the caller commits): what the agent found in the batches."""
    given = patch.model_fields_set
    if patch.layout is not None:
        run.layout_seen = patch.layout
    if "pack_length" in given:
        run.pack_length = patch.pack_length
        run.pack_length_from = patch.pack_length_from if patch.pack_length is not None else None
    elif "pack_length_from" in given and run.pack_length is not None:
        run.pack_length_from = patch.pack_length_from
    if patch.cross_documents is not None:
        run.cross_documents = patch.cross_documents
        run.cross_documents_detail = patch.cross_documents_detail


def record_refusals(session: Session, run: Run, body: Refusals) -> None:
    """Store each refusal once per (rank, interval); the first reason given is kept."""
    dialect = session.get_bind().dialect.name
    now = _now()
    rows = [
        {
            "run_pk": run.id,
            "rank": r.rank,
            "interval": r.interval,
            "first_step": r.first_step,
            "last_step": r.last_step,
            "refused_by": r.by,
            "reason": r.reason[:MAX_REASON],
            "refused_at": now,
        }
        for r in body.refusals
    ]
    statement: Any
    if dialect == "postgresql":
        statement = pg_insert(refused_intervals).on_conflict_do_nothing()
    elif dialect == "sqlite":
        statement = sqlite_insert(refused_intervals).on_conflict_do_nothing()
    else:  # pragma: no cover - the two databases packscope runs on
        statement = insert(refused_intervals)
    session.execute(statement, rows)
    # A refusal is contact too: the agent that sent it is alive.
    run.last_contact_at = now
    session.commit()
