"""Dashboard templates and static assets, served by the backend (see backend/routes/pages.py)."""

from pathlib import Path

TEMPLATES_DIR = Path(__file__).resolve().parent / "templates"
STATIC_DIR = Path(__file__).resolve().parent / "static"
