"""The FastAPI application: JSON API, dashboards and static assets over one database."""

import math
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request, status
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

from packscope import __version__
from packscope.backend.db import make_engine, make_sessionmaker, upgrade_schema
from packscope.backend.routes import ingest, pages, reads
from packscope.backend.settings import Settings
from packscope.frontend import STATIC_DIR


def _echo(value: Any) -> Any:
    """What a 422 repeats of the offending input: scalars only, and JSON-safe."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return value if isinstance(value, str | int | float | bool) or value is None else "..."


async def _validation_error(_request: Request, exc: Exception) -> JSONResponse:
    # Pydantic's list of what is wrong, without echoing whole records (a batch can be megabytes)
    # and without NaN/inf, which JSON cannot carry.
    assert isinstance(exc, RequestValidationError)
    errors = [{**e, "input": _echo(e.get("input"))} for e in exc.errors()]
    return JSONResponse(status_code=status.HTTP_422_UNPROCESSABLE_CONTENT, content={"detail": jsonable_encoder(errors)})


def create_app(settings: Settings | None = None) -> FastAPI:
    """An app over `settings.database_url` (default: PACKSCOPE_* environment variables).

    The schema is brought to the latest migration here, so a fresh database works at once.
    """
    settings = settings or Settings()
    engine = make_engine(settings.database_url)
    upgrade_schema(engine)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        engine.dispose()

    app = FastAPI(
        title="packscope",
        version=__version__,
        summary="How fast is this training run, really?",
        lifespan=lifespan,
    )
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.state.settings = settings
    app.state.engine = engine
    app.state.sessionmaker = make_sessionmaker(engine)
    app.include_router(ingest.router)
    app.include_router(reads.router)
    app.include_router(pages.public)
    app.include_router(pages.router)
    app.add_exception_handler(pages.SignInRequired, pages.sign_in_required)
    app.mount("/static", StaticFiles(directory=STATIC_DIR), name="static")
    return app
