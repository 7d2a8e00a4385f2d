"""Where the alerts' thresholds and webhooks come from: the server's environment (or `packscope serve`'s
flags) first, then what the API stored in `alert_settings` (project "" server-wide, then the run's
project), later ones winning."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from sqlalchemy import Connection, select
from sqlalchemy.dialects import postgresql, sqlite

from packscope.backend.alerts.rules import Thresholds
from packscope.backend.store.models import alert_settings

Format = Literal["json", "slack"]
FORMATS: tuple[Format, ...] = ("json", "slack")
WEBHOOK_KEYS = ("webhook_urls", "webhook_secret", "webhook_format")  # server-wide only (project "")


@dataclass(frozen=True)
class Webhooks:
    urls: tuple[str, ...] = ()
    secret: str | None = None
    format: Format = "json"


@dataclass(frozen=True)
class AlertConfig:
    """The server's own (environment) settings of the alerts."""

    thresholds: Mapping[str, Any] = field(default_factory=dict)  # overrides of Thresholds' defaults
    webhooks: Webhooks = Webhooks()
    public_url: str = ""  # the server's address as receivers reach it, for run_url
    sweep_s: float = 5.0  # how often every live run is judged without a new interval (stalled, crashed)
    # Rounds woken by new batches are at least this far apart: a large job's ranks post all the
    # time, and every round reads the runs' windows again (its CPU is the ingest's too).
    judge_gap_s: float = 1.0
    delivery_poll_s: float = 1.0  # how often the outbox is looked at for due messages
    retry_base_s: float = 2.0  # a failed message waits base·2^(attempts-1) s, at most retry_max_s
    retry_max_s: float = 300.0
    send_timeout_s: float = 10.0
    claim_s: float = 60.0  # a claimed message another process may take over after this long

    @classmethod
    def of(
        cls, thresholds_json: str, urls: str, secret: str | None, fmt: str, public_url: str, **timing: float
    ) -> AlertConfig:
        """From the environment's text; raises ValueError naming what is wrong."""
        try:
            thresholds = json.loads(thresholds_json) if thresholds_json.strip() else {}
        except ValueError as exc:
            raise ValueError(f"PACKSCOPE_ALERT_THRESHOLDS is not JSON: {exc}") from None
        if not isinstance(thresholds, dict):
            raise ValueError('PACKSCOPE_ALERT_THRESHOLDS must be a JSON object, e.g. {"slowdown_pct": 30}')
        Thresholds.checked(thresholds)
        if fmt not in FORMATS:
            raise ValueError(f"PACKSCOPE_ALERT_WEBHOOK_FORMAT must be one of {', '.join(FORMATS)}, not {fmt!r}")
        listed = tuple(u.strip() for u in urls.split(",") if u.strip())
        for url in listed:
            check_url(url)
        webhooks = Webhooks(listed, secret or None, fmt)
        return cls(thresholds, webhooks, public_url.rstrip("/"), **timing)


def check_url(url: str) -> None:
    if not url.startswith(("http://", "https://")) or len(url) > 2000:
        raise ValueError(f"a webhook URL must start with http:// or https:// (at most 2000 characters): {url!r}")


def stored(connection: Connection, project: str) -> dict[str, Any]:
    found = connection.execute(select(alert_settings.c.settings).where(alert_settings.c.project == project)).scalar()
    return dict(found) if isinstance(found, dict) else {}


def thresholds_for(connection: Connection, config: AlertConfig, project: str | None) -> Thresholds:
    server_wide = {k: v for k, v in stored(connection, "").items() if k not in WEBHOOK_KEYS}
    own = stored(connection, project) if project else {}
    return Thresholds.merged(config.thresholds, server_wide, own)


def webhooks_of(connection: Connection, config: AlertConfig) -> Webhooks:
    """The environment's webhooks, with what the API set in their place."""
    api = stored(connection, "")
    hooks = config.webhooks
    return Webhooks(
        tuple(api["webhook_urls"]) if "webhook_urls" in api else hooks.urls,
        api.get("webhook_secret", hooks.secret),
        api.get("webhook_format", hooks.format),
    )


def save(connection: Connection, project: str, changes: Mapping[str, Any]) -> dict[str, Any]:
    """Apply `changes` (None removes a key) to the project's stored settings; the result."""
    current = stored(connection, project)
    for key, value in changes.items():
        if value is None and key != "mfu_floor":
            current.pop(key, None)
        else:
            current[key] = value
    Thresholds.checked({k: v for k, v in current.items() if k not in WEBHOOK_KEYS})
    values = {"project": project, "settings": current, "updated_at": datetime.now(UTC)}
    dialect = {"sqlite": sqlite, "postgresql": postgresql}[connection.dialect.name]
    statement = dialect.insert(alert_settings).values(values)
    connection.execute(
        statement.on_conflict_do_update(
            index_elements=["project"],
            set_={"settings": statement.excluded.settings, "updated_at": values["updated_at"]},
        )
    )
    return current
