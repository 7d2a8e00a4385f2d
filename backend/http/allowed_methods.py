"""405 and OPTIONS answers that name every method a path serves.

A path served by routes of several routers (GET /api/v1/runs in the reads, POST in the ingest)
is matched route by route, so Starlette's 405 names only the first route's methods; this handler
names them all, and answers OPTIONS with 204 and the same Allow.
"""

from fastapi import FastAPI, Request, Response, status
from fastapi.responses import JSONResponse
from starlette.routing import Match

CANDIDATES = ("DELETE", "GET", "HEAD", "PATCH", "POST", "PUT")


def methods_of(app: FastAPI, request: Request) -> list[str]:
    """The methods some route serves at the request's path: each tried against the routes as
    the router matches them (a route matches fully only with its own method)."""
    methods = set()
    for method in CANDIDATES:
        scope = {**request.scope, "method": method}
        if any(route.matches(scope)[0] == Match.FULL for route in app.router.routes):
            methods.add(method)
    return sorted(methods | {"OPTIONS"}) if methods else []


async def method_not_allowed(request: Request, exc: Exception) -> Response:
    allowed = methods_of(request.app, request)
    if not allowed:  # not a route's (the static files' own 405): as it was raised
        headers = getattr(exc, "headers", None) or {}
        return JSONResponse({"detail": f"{request.method} is not served at {request.url.path}"}, 405, headers)
    headers = {"Allow": ", ".join(allowed)}
    if request.method == "OPTIONS":
        return Response(status_code=status.HTTP_204_NO_CONTENT, headers=headers)
    return JSONResponse(
        {"detail": f"{request.method} is not served at {request.url.path}; it serves {', '.join(allowed)}"},
        status_code=status.HTTP_405_METHOD_NOT_ALLOWED,
        headers=headers,
    )


def add_allowed_methods_handler(app: FastAPI) -> None:
    app.add_exception_handler(status.HTTP_405_METHOD_NOT_ALLOWED, method_not_allowed)
