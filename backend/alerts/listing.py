"""Alerts as the API, the CLI and the pages read them."""

from __future__ import annotations

from typing import Any, Literal

from sqlalchemy import Connection, select

from packscope.backend.alerts.state import alert_json
from packscope.backend.store.models import Run, alerts

State = Literal["open", "resolved", "all"]
_RUNS = Run.__table__


def list_alerts(
    connection: Connection, public_url: str, state: State = "open", run_pk: int | None = None, limit: int = 500
) -> list[dict[str, Any]]:
    """Newest first; with the run's id, name and project."""
    query = select(*alerts.c, _RUNS.c.run_id, _RUNS.c.name, _RUNS.c.project).join(_RUNS, _RUNS.c.id == alerts.c.run_pk)
    if state == "open":
        query = query.where(alerts.c.resolved_at.is_(None))
    elif state == "resolved":
        query = query.where(alerts.c.resolved_at.is_not(None))
    if run_pk is not None:
        query = query.where(alerts.c.run_pk == run_pk)
    rows = connection.execute(query.order_by(alerts.c.opened_at.desc(), alerts.c.id.desc()).limit(limit)).mappings()
    return [
        {**alert_json(dict(row), row["run_id"], public_url), "run_name": row["name"], "project": row["project"]}
        for row in rows
    ]


def open_counts(connection: Connection, run_pks: list[int]) -> dict[int, list[str]]:
    """run_pk -> the rules of its open alerts (the runs list's badge)."""
    if not run_pks:
        return {}
    rows = connection.execute(
        select(alerts.c.run_pk, alerts.c.rule)
        .where(alerts.c.run_pk.in_(run_pks), alerts.c.resolved_at.is_(None))
        .order_by(alerts.c.run_pk, alerts.c.rule)
    ).all()
    out: dict[int, list[str]] = {}
    for run_pk, rule in rows:
        out.setdefault(run_pk, []).append(rule)
    return out
