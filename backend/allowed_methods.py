"""405 and OPTIONS answers that name every method a path serves.

A path served by routes of several routers (GET /api/v1/runs in the reads, POST in the ingest)
is matched route by route, so Starlette's 405 names only the first route's methods; this handler
names them all, and answers OPTIONS with 204 and the same Allow.
"""

from fastapi import FastAPI, Request, Response, status
from fastapi.responses import JSONResponse
from starlette.routing import Match, Route


def methods_of(app: FastAPI, request: Request) -> list[str]:
    methods: set[str] = set()
    for route in app.router.routes:
        if isinstance(route, Route) and route.methods:
            match, _ = route.matches(request.scope)
            if match != Match.NONE:
                methods |= route.methods
    return sorted(methods | {"OPTIONS"}) if methods else []


async def method_not_allowed(request: Request, _exc: Exception) -> Response:
    allowed = methods_of(request.app, request)
    headers = {"Allow": ", ".join(allowed)}
    if request.method == "OPTIONS" and allowed:
        return Response(status_code=status.HTTP_204_NO_CONTENT, headers=headers)
    return JSONResponse(
        {"detail": f"{request.method} is not served at {request.url.path}; it serves {', '.join(allowed)}"},
        status_code=status.HTTP_405_METHOD_NOT_ALLOWED,
        headers=headers,
    )


def add_allowed_methods_handler(app: FastAPI) -> None:
    app.add_exception_handler(status.HTTP_405_METHOD_NOT_ALLOWED, method_not_allowed)
