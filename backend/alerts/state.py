"""Opening and resolving alerts, each with its webhook messages in the same transaction, so that a
message exists exactly when its event happened, once per (alert, event, target).

Opening inserts with ON CONFLICT DO NOTHING against the partial unique index on open alerts
(run, rule, subject): two processes that judge the same run open one alert, and only the one
whose insert returned a row writes the messages. Resolving is an UPDATE of an alert still open,
and only the process whose update returned the row writes them.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, insert, select, text, update
from sqlalchemy.dialects import postgresql, sqlite

from packscope.backend.alerts.config import Webhooks
from packscope.backend.alerts.rules import Firing
from packscope.backend.reads.liveness import as_utc
from packscope.backend.store.models import alert_outbox, alerts

EVENTS = {"opened": "alert.opened", "resolved": "alert.resolved"}


def _iso(moment: datetime | None) -> str | None:
    utc = as_utc(moment)
    return None if utc is None else utc.isoformat().replace("+00:00", "Z")


def alert_json(row: Mapping[str, Any], run_id: str, public_url: str) -> dict[str, Any]:
    """An alert as the API and the webhooks give it."""
    return {
        "id": row["id"],
        "run_id": run_id,
        "rule": row["rule"],
        "subject": row["subject"],
        "opened_at": _iso(row["opened_at"]),
        "resolved_at": _iso(row["resolved_at"]),
        "summary": row["summary"],
        "ledger_term": row["ledger_term"],
        "details": row["details"],
        "run_url": f"{public_url}/runs/{run_id}",
    }


def message_body(event: str, alert: Mapping[str, Any], fmt: str, run_name: str | None) -> str:
    """The exact text sent (and signed): the generic payload, or Slack's {"text": ...}."""
    if fmt == "slack":
        state = "resolved" if event == "resolved" else "OPEN"
        subject = f" ({alert['subject']})" if alert["subject"] else ""
        name = run_name or alert["run_id"]
        text_ = f"[packscope] {state}: {alert['rule']}{subject} on run {name}: {alert['summary']} <{alert['run_url']}>"
        return json.dumps({"text": text_})
    return json.dumps({"event": EVENTS[event], "alert": alert}, sort_keys=True, allow_nan=False)


def signature(body: bytes, secret: str) -> str:
    """X-Packscope-Signature: sha256=<hex HMAC-SHA256 of the raw body>."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def event_id(alert_id: int, event: str) -> str:
    """X-Packscope-Event-Id: the same at every retry and from every process, for receivers to dedupe."""
    return f"packscope-alert-{alert_id}-{event}"


def _enqueue(
    connection: Connection, row: Mapping[str, Any], event: str, run: Mapping[str, Any], hooks: Webhooks, public: str
) -> int:
    if not hooks.urls:
        return 0
    now = datetime.now(UTC)
    alert = alert_json(row, run["run_id"], public)
    body = message_body(event, alert, hooks.format, run.get("name"))
    connection.execute(
        insert(alert_outbox),
        [
            {"alert_id": row["id"], "event": event, "target": url, "body": body, "created_at": now,
             "next_attempt_at": now, "attempts": 0}
            for url in hooks.urls
        ],
    )  # fmt: skip
    return len(hooks.urls)


def open_alert(
    connection: Connection,
    run: Mapping[str, Any],
    rule: str,
    subject: str,
    firing: Firing,
    hooks: Webhooks,
    public: str,
) -> int | None:
    """The new alert's id, or None where an open one for (run, rule, subject) exists already."""
    values = {
        "run_pk": run["id"], "rule": rule, "subject": subject[:500], "opened_at": datetime.now(UTC),
        "resolved_at": None, "summary": firing.summary, "ledger_term": firing.ledger_term,
        "details": firing.details,
    }  # fmt: skip
    dialect = {"sqlite": sqlite, "postgresql": postgresql}[connection.dialect.name]
    statement = (
        dialect.insert(alerts)
        .values(values)
        .on_conflict_do_nothing(index_elements=["run_pk", "rule", "subject"], index_where=text("resolved_at IS NULL"))
        .returning(alerts.c.id)
    )
    new_id = connection.execute(statement).scalar()
    if new_id is None:
        return None
    _enqueue(connection, {**values, "id": new_id}, "opened", run, hooks, public)
    return int(new_id)


def resolve_alert(
    connection: Connection,
    run: Mapping[str, Any],
    alert_id: int,
    hooks: Webhooks,
    public: str,
    through: int | None = None,
) -> bool:
    """True where this call resolved it (it was still open). `through`: the latest interval judged,
    kept in its details as resolved_through (rules.RunFacts.reported: what it covered)."""
    now = datetime.now(UTC)
    row = (
        connection.execute(
            update(alerts)
            .where(alerts.c.id == alert_id, alerts.c.resolved_at.is_(None))
            .values(resolved_at=now)
            .returning(*alerts.c)
        )
        .mappings()
        .first()
    )
    if row is None:
        return False
    resolved = dict(row)
    if through is not None:
        resolved["details"] = {**(row["details"] or {}), "resolved_through": through}
        connection.execute(update(alerts).where(alerts.c.id == alert_id).values(details=resolved["details"]))
    _enqueue(connection, resolved, "resolved", run, hooks, public)
    return True


def open_alerts(connection: Connection, run_pk: int) -> dict[tuple[str, str], int]:
    """(rule, subject) -> id of the run's open alerts."""
    rows = connection.execute(
        select(alerts.c.rule, alerts.c.subject, alerts.c.id).where(
            alerts.c.run_pk == run_pk, alerts.c.resolved_at.is_(None)
        )
    ).all()
    return {(rule, subject): int(i) for rule, subject, i in rows}


def runs_with_open_alerts(connection: Connection) -> Sequence[int]:
    return connection.execute(select(alerts.c.run_pk).where(alerts.c.resolved_at.is_(None)).distinct()).scalars().all()
