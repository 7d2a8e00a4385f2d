"""Dashboard templates and static assets, served by the backend (see backend/routes/pages.py)."""

from pathlib import Path

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
STATIC_DIR = Path(__file__).resolve().parent / "static"
# plotly.js's partial "cartesian" bundle (scatter, bar, heatmap: every trace type the pages draw,
# a third of the full bundle's size), committed here from the npm package that package-lock.json
# pins (`make vendor-plotly` copies it again after `npm ci`), so that the server needs no npm.
PLOTLY_JS = Path(__file__).resolve().parent / "vendor" / "plotly-cartesian.min.js"
