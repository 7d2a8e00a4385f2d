"""Server-rendered dashboard pages; the JS on each page reads the JSON API (docs/api.md)."""

import json
import os
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Form, Query, Request, status
from fastapi.responses import FileResponse, HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from packscope.backend.alerts.listing import list_alerts
from packscope.backend.http.deps import READ_COOKIE, Credentials, SessionDep, SettingsDep, read_allowed, token_matches
from packscope.backend.http.security import read_cookie_value
from packscope.backend.reads.summaries import run_summary
from packscope.backend.routes.ingest import RUN_ID
from packscope.backend.store.runs import get_run
from packscope.frontend import PLOTLY_JS, TEMPLATES_DIR


def _server_notices(request: Request) -> dict[str, Any]:
    # base.html shows a banner on every page while writes are open to anyone.
    return {"writes_open": request.app.state.settings.writes_open}


templates = Jinja2Templates(directory=str(TEMPLATES_DIR), context_processors=[_server_notices])


class SignInRequired(Exception):
    """Raised by page dependencies when reads are closed and the visitor has no token."""


def require_reader(request: Request, settings: SettingsDep, credentials: Credentials) -> None:
    if not read_allowed(request, settings, credentials):
        raise SignInRequired


def _local(path: str) -> str:
    # Only a local path: never redirect to another site.
    return path if path.startswith("/") and not path.startswith("//") else "/"


def sign_in_page(
    request: Request, message: str | None = None, code: int = status.HTTP_401_UNAUTHORIZED, next: str | None = None
):
    # The page asked for, with its query (a chart's x axis, the runs' filters); after a refused
    # token the form posts back to /sign-in, so it keeps the one first asked for.
    asked = request.url.path + (f"?{request.url.query}" if request.url.query else "")
    target = asked if next is None else _local(next)
    return templates.TemplateResponse(
        request, "sign_in.html", {"page": "sign-in", "next": target, "message": message}, status_code=code
    )


async def sign_in_required(request: Request, exc: Exception) -> HTMLResponse:
    """Exception handler: a closed dashboard answers with its sign-in form."""
    return sign_in_page(request)


# `public` serves the sign-in form's target and the plotly bundle; `router` the data pages.
public = APIRouter(include_in_schema=False)
router = APIRouter(include_in_schema=False, dependencies=[Depends(require_reader)])


@public.post("/sign-in")
def sign_in(request: Request, settings: SettingsDep, token: Annotated[str, Form()], next: Annotated[str, Form()] = "/"):
    if settings.read_token is None or not token_matches(settings.read_token, token):
        return sign_in_page(request, "That token does not match the server's PACKSCOPE_READ_TOKEN.", next=next)
    response = RedirectResponse(_local(next), status_code=status.HTTP_303_SEE_OTHER)
    response.set_cookie(
        READ_COOKIE, read_cookie_value(token), httponly=True, samesite="strict", secure=request.url.scheme == "https"
    )
    return response


@router.get("/", response_class=HTMLResponse)
def runs_page(request: Request):
    return templates.TemplateResponse(request, "runs.html", {"page": "runs"})


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: str, session: SessionDep):
    run = get_run(session, run_id) if RUN_ID.fullmatch(run_id) else None
    if run is None:
        return templates.TemplateResponse(request, "not_found.html", {"page": "run", "run_id": run_id}, status_code=404)
    # The header is rendered here so the page reads right before the first fetch returns.
    summary = run_summary(session, run)
    settings = {name: _flat(summary[name]) for name in ("config", "model", "parallel", "hardware")}
    public_url = request.app.state.settings.alert_config().public_url
    alerts = list_alerts(session.connection(), public_url, "all", run_pk=run.id)
    context = {"page": "run", "run_id": run_id, "run": summary, "settings": settings, "alerts": alerts}
    return templates.TemplateResponse(request, "run.html", context)


def _flat(value: Any, prefix: str = "") -> list[tuple[str, str]]:
    """A run's nested settings as (dotted key, JSON value) rows, keys sorted: one table to read
    and to diff by eye between runs."""
    if isinstance(value, dict) and value:
        return [row for key in sorted(value) for row in _flat(value[key], f"{prefix}{key}.")]
    return [(prefix.rstrip("."), json.dumps(value, ensure_ascii=False))] if prefix else []


@router.get("/compare", response_class=HTMLResponse)
def compare_page(request: Request, run_id: list[str] = Query(default=[])):
    return templates.TemplateResponse(request, "compare.html", {"page": "compare", "run_ids": run_id})


BUNDLE_CACHE = "public, max-age=604800"


def _etag_matches(if_none_match: str | None, etag: str) -> bool:
    """Whether an If-None-Match header names `etag` (weak or strong, as RFC 9110's GET compares)."""
    if if_none_match is None:
        return False
    tags = {tag.strip().removeprefix("W/") for tag in if_none_match.split(",")}
    return "*" in tags or etag.removeprefix("W/") in tags


@public.get("/vendor/plotly.min.js")
def plotly_bundle(request: Request):
    # Shipped in the package (packscope/frontend: no CDN, so the dashboard works on offline
    # clusters) and tied to its version; a week of caching keeps page loads cheap. After the
    # week the browser asks again with its ETag: a 304 keeps its copy, and with it the compiled
    # code Chromium keeps beside a script it has run twice (a 200 would make it start over).
    bundle = FileResponse(
        PLOTLY_JS,
        media_type="text/javascript",
        headers={"Cache-Control": BUNDLE_CACHE},
        stat_result=os.stat(PLOTLY_JS),
    )
    etag = bundle.headers["etag"]
    if _etag_matches(request.headers.get("if-none-match"), etag):
        return Response(status_code=304, headers={"ETag": etag, "Cache-Control": BUNDLE_CACHE})
    return bundle
