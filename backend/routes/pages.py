"""Server-rendered dashboard pages; the JS on each page reads the JSON API (docs/api.md)."""

from pathlib import Path

import plotly
from fastapi import APIRouter, Query, Request
from fastapi.responses import FileResponse, HTMLResponse
from fastapi.templating import Jinja2Templates

from packscope.backend import queries
from packscope.backend.deps import SessionDep
from packscope.frontend import TEMPLATES_DIR

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=str(TEMPLATES_DIR))

# The bundle ships inside the plotly wheel, so the dashboard works on offline clusters.
PLOTLY_JS = Path(plotly.__file__).resolve().parent / "package_data" / "plotly.min.js"


@router.get("/", response_class=HTMLResponse)
def runs_page(request: Request):
    return templates.TemplateResponse(request, "runs.html", {"page": "runs"})


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: str, session: SessionDep):
    run = queries.get_run(session, run_id)
    if run is None:
        return templates.TemplateResponse(
            request, "not_found.html", {"page": "run", "run_id": run_id}, status_code=404
        )
    # The header is rendered here so the page reads right before the first fetch returns.
    summary = queries.run_summary(session, run)
    return templates.TemplateResponse(request, "run.html", {"page": "run", "run_id": run_id, "run": summary})


@router.get("/compare", response_class=HTMLResponse)
def compare_page(request: Request, run_id: list[str] = Query(default=[])):
    return templates.TemplateResponse(request, "compare.html", {"page": "compare", "run_ids": run_id})


@router.get("/vendor/plotly.min.js")
def plotly_bundle():
    # Tied to the installed plotly version; a week of caching keeps page loads cheap.
    return FileResponse(
        PLOTLY_JS,
        media_type="text/javascript",
        headers={"Cache-Control": "public, max-age=604800"},
    )
