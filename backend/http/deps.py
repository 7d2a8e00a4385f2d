"""Request dependencies shared by the routers: settings, a database session, bearer tokens."""

import hmac
from collections.abc import AsyncIterator
from datetime import datetime
from typing import Annotated

from fastapi import Depends, HTTPException, Path, Request, status
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.security.utils import get_authorization_scheme_param
from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from packscope.backend.api.schemas import RUN_ID_PATTERN
from packscope.backend.http.admission import Admission
from packscope.backend.http.security import READ_COOKIE, read_cookie_value
from packscope.backend.http.settings import Settings
from packscope.backend.store.models import Run, deleted_runs
from packscope.backend.store.runs import get_run

_bearer = HTTPBearer(auto_error=False)
Credentials = Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]


# The dependencies below are `async def` though they never wait: FastAPI runs a plain `def`
# dependency in a worker thread, a thread hop per dependency per request for a few attribute reads.
async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_session(request: Request) -> AsyncIterator[Session]:
    """A session for one request: its turn is taken after the body is read and validated, and it
    is closed as soon as the endpoint returns (before the response is sent).

    Writes (any method but GET/HEAD) get a write session, which on SQLite begins IMMEDIATE.
    """
    state = request.app.state
    admission: Admission = state.admission
    writes = request.method not in ("GET", "HEAD")
    async with admission.turn(writes):
        session = (state.write_sessionmaker if writes else state.sessionmaker)()
        try:
            yield session
        finally:
            await admission.run_closing(session.close)


SettingsDep = Annotated[Settings, Depends(get_settings)]
# Every run id was checked against this when the run was created, so one that does not match
# names no run: 422 before any query, the same answer on every database (a NUL would otherwise
# reach PostgreSQL, which refuses it, and SQLite, which finds nothing).
RunIdPath = Annotated[str, Path(pattern=RUN_ID_PATTERN, description="the run's client-made id")]
SessionDep = Annotated[Session, Depends(get_session, scope="function")]


def token_matches(expected: str, given: str | None) -> bool:
    return given is not None and hmac.compare_digest(given.encode(), expected.encode())


def _refused(variable: str) -> HTTPException:
    return HTTPException(
        status.HTTP_401_UNAUTHORIZED,
        detail=f"missing or wrong bearer token: send 'Authorization: Bearer <token>' "
        f"with the token the server was given in {variable}",
        headers={"WWW-Authenticate": "Bearer"},
    )


def _check(expected: str | None, given: HTTPAuthorizationCredentials | None, variable: str) -> None:
    if expected is not None and not token_matches(expected, given.credentials if given else None):
        raise _refused(variable)


def bearer_credentials(authorization: str | None) -> str | None:
    """The token of an Authorization header as HTTPBearer(auto_error=False) reads it (scheme
    "Bearer" in any case, the rest stripped), or None."""
    scheme, credentials = get_authorization_scheme_param(authorization)
    if not (authorization and scheme and credentials) or scheme.lower() != "bearer":
        return None
    return credentials


async def require_ingest_token(settings: SettingsDep, credentials: Credentials) -> None:
    _check(settings.ingest_token, credentials, "PACKSCOPE_INGEST_TOKEN")


async def check_ingest_token(request: Request) -> None:
    """require_ingest_token for a route served without dependency resolution (the intervals POST),
    without HTTPBearer's credentials object: the header is read only when a token is set."""
    expected: str | None = request.app.state.settings.ingest_token
    if expected is not None and not token_matches(expected, bearer_credentials(request.headers.get("authorization"))):
        raise _refused("PACKSCOPE_INGEST_TOKEN")


def read_allowed(request: Request, settings: Settings, credentials: HTTPAuthorizationCredentials | None) -> bool:
    """Reads are open, or the request carries the read token (bearer header or sign-in cookie)."""
    expected = settings.read_token
    return (
        expected is None
        or token_matches(expected, credentials.credentials if credentials else None)
        or token_matches(read_cookie_value(expected), request.cookies.get(READ_COOKIE))
    )


async def require_read_token(request: Request, settings: SettingsDep, credentials: Credentials) -> None:
    if not read_allowed(request, settings, credentials):
        _check(settings.read_token, credentials, "PACKSCOPE_READ_TOKEN")


def run_not_found(run_id: str) -> HTTPException:
    what = "is not stored; GET /api/v1/runs lists the runs, and an agent creates its run with POST /api/v1/runs"
    return HTTPException(status.HTTP_404_NOT_FOUND, detail=f"run {run_id!r} {what}")


def run_or_404(session: Session, run_id: str) -> Run:
    run = get_run(session, run_id)
    if run is None:
        raise run_not_found(run_id)
    return run


def deleted_at(session: Session, run_id: str) -> datetime | None:
    return session.scalar(select(deleted_runs.c.deleted_at).where(deleted_runs.c.run_id == run_id))


def run_gone(run_id: str, when: datetime) -> HTTPException:
    return HTTPException(
        status.HTTP_410_GONE,
        detail=f"run {run_id!r} was deleted at {when.isoformat()}; nothing more is stored for it. Start a "
        "new run_id, or create it again on purpose with POST /api/v1/runs?recreate=true",
    )


def missing_run(session: Session, run_id: str) -> HTTPException:
    """What a write to a run that is not stored is answered: 410 if it was deleted, else 404."""
    when = deleted_at(session, run_id)
    return run_not_found(run_id) if when is None else run_gone(run_id, when)


# A write's run, locked against a DELETE until the write commits (PostgreSQL's FOR KEY SHARE; SQLite
# serialises writes and takes no such clause): a write racing the delete waits for it and is 410,
# instead of meeting the deleted run in a foreign key or an UPDATE (a 500).
_RUN_TO_WRITE = select(Run).where(Run.run_id == bindparam("run_id")).with_for_update(key_share=True)


def run_to_write(session: Session, run_id: str) -> Run:
    run = session.scalars(_RUN_TO_WRITE, {"run_id": run_id}).one_or_none()
    if run is None:
        raise missing_run(session, run_id)
    return run
