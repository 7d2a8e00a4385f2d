"""The status the pages show: a running run whose agent stopped calling is stale, then crashed."""

from datetime import UTC, datetime

from packscope.backend.store.models import Run


def as_utc(moment: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes (stored in UTC), PostgreSQL ones in the session's zone.
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


DEFAULT_HEARTBEAT_S = 30.0  # what the agent promises by default; runs of older agents are judged by it
STALE_BEATS = 3  # a running run is stale once this many heartbeats are missing...
CRASHED_BEATS = 10  # ...and crashed once this many are


def last_contact(run: Run) -> datetime:
    """When the run's agent last reached the server: a heartbeat, a refusal report, or (updated_at)
    its registration, a new record or a status."""
    return _latest(run.updated_at, run.last_contact_at)


def _latest(updated_at: datetime, last_contact_at: datetime | None) -> datetime:
    moments = [m for m in (as_utc(updated_at), as_utc(last_contact_at)) if m is not None]
    return max(moments)


def shown_status(run: Run, now: datetime) -> str:
    """The status the pages show: a running run whose agent stopped calling is "stale" after
    STALE_BEATS missed heartbeats and "crashed" after CRASHED_BEATS; contact makes it running again."""
    return liveness(run.status, run.updated_at, run.last_contact_at, run.heartbeat_s, now)


def liveness(
    status: str, updated_at: datetime, last_contact_at: datetime | None, heartbeat_s: float | None, now: datetime
) -> str:
    if status != "running":
        return status
    silent = (now - _latest(updated_at, last_contact_at)).total_seconds()
    beat = heartbeat_s or DEFAULT_HEARTBEAT_S
    if silent >= CRASHED_BEATS * beat:
        return "crashed"
    if silent >= STALE_BEATS * beat:
        return "stale"
    return "running"
