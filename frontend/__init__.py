"""Dashboard templates and static assets, served by the backend (see backend/routes/pages.py)."""

from pathlib import Path

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
STATIC_DIR = Path(__file__).resolve().parent / "static"
# plotly.js's core with the three trace types the pages draw (scatter, bar, heatmap), built by
# frontend/plotly_bundle.mjs from the npm package that package-lock.json pins (`make
# vendor-plotly` builds it again after `npm ci`) and committed, so that the server needs no npm.
PLOTLY_JS = Path(__file__).resolve().parent / "vendor" / "plotly.min.js"
