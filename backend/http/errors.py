"""Database failures as answers a client can act on: 503 with Retry-After when the server is busy
or its database is unavailable, 422 when a value cannot be stored. Never a bare 500 or a traceback."""

import logging

from fastapi import FastAPI, Request, status
from fastapi.responses import JSONResponse
from sqlalchemy import exc as sa

from packscope.backend.http.admission import Overloaded

log = logging.getLogger("packscope.backend")

# Seconds an unavailable database (restarting, read-only, disk full) is given before a retry.
UNAVAILABLE_RETRY_S = 5


def _driver_message(error: sa.DBAPIError | sa.SQLAlchemyError) -> str:
    # The driver's first line, without SQLAlchemy's SQL, parameters and documentation link.
    original = getattr(error, "orig", None) or error
    return (str(original).strip().splitlines() or [type(original).__name__])[0][:300]


def busy(message: str, retry_after_s: int) -> JSONResponse:
    return JSONResponse(
        {"detail": message},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
        headers={"Retry-After": str(retry_after_s)},
    )


def _why_unavailable(reason: str) -> tuple[str, bool] | None:
    """(what to tell the client, whether it is momentary contention rather than an outage), or
    None for a fault of this server (SQLite also reports a missing table as "operational")."""
    lowered = reason.lower()
    if lowered.startswith(("no such table", "no such column", "syntax error")):
        return None
    if "locked" in lowered or "busy" in lowered:
        return "the database is busy with other writes", True
    if "readonly" in lowered or "read-only" in lowered or "read only" in lowered:
        return "the database is read-only; nothing can be stored until it is writable again", False
    if "full" in lowered or "no space" in lowered:
        return "the database's disk is full; nothing can be stored until space is freed", False
    return "the database is unavailable", False


async def _overloaded(_request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, Overloaded)
    return busy(str(exc), exc.retry_after_s)


async def _pool_timeout(request: Request, exc: Exception) -> JSONResponse:
    retry = request.app.state.settings.retry_after_s
    return busy(f"the server is busy: no database connection came free in time; retry after {retry} s", retry)


async def _database_unavailable(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, sa.SQLAlchemyError)
    reason = _driver_message(exc)
    why = _why_unavailable(reason)
    if why is None:
        raise exc
    what, momentary = why
    retry = request.app.state.settings.retry_after_s if momentary else UNAVAILABLE_RETRY_S
    log.warning("%s %s answered 503: %s (%s)", request.method, request.url.path, what, reason)
    return busy(f"{what} ({reason}); retry after {retry} s", retry)


async def _not_storable(request: Request, exc: Exception) -> JSONResponse:
    # A value the schema let through but the database refuses: the transaction was rolled back,
    # nothing is stored. Shaped like a validation error so clients need one parser.
    assert isinstance(exc, sa.SQLAlchemyError)
    reason = _driver_message(exc)
    log.warning("%s %s answered 422, the database refused a value: %s", request.method, request.url.path, reason)
    detail = [{"loc": ["body"], "msg": f"a value cannot be stored: {reason}", "type": "value_error"}]
    return JSONResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


def add_database_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(Overloaded, _overloaded)
    app.add_exception_handler(sa.TimeoutError, _pool_timeout)
    # OperationalError: locked, read-only, disk full, connection refused or lost, server shutting
    # down; InterfaceError: a connection that broke under the driver.
    app.add_exception_handler(sa.OperationalError, _database_unavailable)
    app.add_exception_handler(sa.InterfaceError, _database_unavailable)
    app.add_exception_handler(sa.DataError, _not_storable)
