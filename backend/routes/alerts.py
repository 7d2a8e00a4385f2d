"""The alerts' API (docs/alerts.md): the alerts opened and resolved, a run's history, and the
thresholds and webhooks set per project."""

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, create_model

from packscope.backend.alerts.config import WEBHOOK_KEYS, save, stored, thresholds_for, webhooks_of
from packscope.backend.alerts.listing import list_alerts
from packscope.backend.alerts.rules import RULES, Thresholds
from packscope.backend.api.text import NO_NUL_PATTERN
from packscope.backend.http.deps import RunIdPath, SessionDep, require_ingest_token, require_read_token, run_or_404

router = APIRouter(prefix="/api/v1", tags=["alerts"], dependencies=[Depends(require_read_token)])


class Alert(BaseModel):
    id: int
    run_id: str = Field(description="the run's client-made id")
    run_name: str | None
    project: str | None
    rule: str = Field(description=", ".join(RULES))
    subject: str = Field(description='what the rule names: "rank 3", a sync site, or ""')
    opened_at: str
    resolved_at: str | None = Field(description="null while the alert is open")
    summary: str
    ledger_term: str | None = Field(description="the loss ledger's term the alert maps to (docs/ledger.md)")
    details: dict[str, Any] = Field(description="the numbers that opened it")
    run_url: str


class AlertSettings(BaseModel):
    project: str = Field(description='"" for the server-wide settings')
    thresholds: dict[str, Any] = Field(description="every threshold in effect for the project (docs/alerts.md)")
    stored: dict[str, Any] = Field(description="what the API set for this project (webhook secret hidden)")
    webhook_urls: list[str] = Field(description="server-wide")
    webhook_format: Literal["json", "slack"]
    webhook_secret_set: bool


def _json_number(value: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("must be a number")
    return value


def _threshold_field(name: str, default: Any) -> tuple[Any, Any]:
    """A threshold as the body may set it: null, or a value in the bounds Thresholds.checked holds.
    A JSON number only: pydantic would otherwise take true and false for 1 and 0, and "3" for 3;
    an integral 3.0 is an integer as JSON Schema reads it."""
    if isinstance(default, int):
        kind: Any = Annotated[
            int, Field(ge=0 if name == "warmup_intervals" else 1, le=1_000_000), BeforeValidator(_json_number)
        ]
    else:
        kind = Annotated[float, Field(ge=0, le=1e300, allow_inf_nan=False), BeforeValidator(_json_number)]
    # (the bounds before the validator: after it, pydantic would leave them out of the JSON Schema)
    return kind | None, Field(default=None, description=f"default {default}")


# No whitespace nor control character (C0, C1), spelled out: \s differs between regex engines (\x85).
_WEBHOOK_URL = Annotated[str, Field(pattern=r"^https?://[^\x00-\x20\x7f-\x9f\s]+$", max_length=2000)]
_THRESHOLD_FIELDS = {name: _threshold_field(name, value) for name, value in Thresholds().as_dict().items()}
# Thresholds to set (null removes the project's own value; mfu_floor null switches it off), and
# the webhooks, server-wide only (project "").
_PATCH_FIELDS: dict[str, Any] = {
    "webhook_urls": (list[_WEBHOOK_URL] | None, Field(default=None, max_length=20)),
    "webhook_secret": (str | None, Field(default=None, max_length=500, pattern=NO_NUL_PATTERN)),
    "webhook_format": (Literal["json", "slack"] | None, None),
    **_THRESHOLD_FIELDS,
}
AlertSettingsPatch = create_model("AlertSettingsPatch", __config__=ConfigDict(extra="forbid"), **_PATCH_FIELDS)
_PROJECT = Annotated[str, Query(max_length=200, pattern=NO_NUL_PATTERN, description='"" for the server-wide settings')]


def _public_url(request: Request) -> str:
    return request.app.state.settings.alert_config().public_url


@router.get("/alerts", response_model=list[Alert])
def get_alerts(
    request: Request,
    session: SessionDep,
    state: Annotated[Literal["open", "resolved", "all"], Query()] = "open",
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> list[dict[str, Any]]:
    """Alerts, newest first: open (default), resolved or all."""
    return list_alerts(session.connection(), _public_url(request), state, limit=limit)


@router.get("/runs/{run_id}/alerts", response_model=list[Alert])
def get_run_alerts(run_id: RunIdPath, request: Request, session: SessionDep) -> list[dict[str, Any]]:
    """Every alert of the run, open and resolved, newest first."""
    run = run_or_404(session, run_id)
    return list_alerts(session.connection(), _public_url(request), "all", run_pk=run.id)


def _settings(request: Request, session: SessionDep, project: str) -> dict[str, Any]:
    config = request.app.state.settings.alert_config()
    connection = session.connection()
    hooks = webhooks_of(connection, config)
    own = stored(connection, project)
    if "webhook_secret" in own:
        own["webhook_secret"] = "(set)"
    return {
        "project": project,
        "thresholds": thresholds_for(connection, config, project or None).as_dict(),
        "stored": own,
        "webhook_urls": list(hooks.urls),
        "webhook_format": hooks.format,
        "webhook_secret_set": bool(hooks.secret),
    }


@router.get("/alerts/settings", response_model=AlertSettings)
def get_alert_settings(request: Request, session: SessionDep, project: _PROJECT = "") -> dict[str, Any]:
    return _settings(request, session, project)


@router.patch("/alerts/settings", response_model=AlertSettings, dependencies=[Depends(require_ingest_token)])
def patch_alert_settings(
    body: AlertSettingsPatch,  # type: ignore[valid-type]
    request: Request,
    session: SessionDep,
    project: _PROJECT = "",
) -> dict[str, Any]:
    """Set thresholds for a project ("" server-wide), and the server-wide webhooks."""
    changes = body.model_dump(exclude_unset=True)  # type: ignore[attr-defined]
    hooks = [key for key in changes if key in WEBHOOK_KEYS]
    if project and hooks:
        message = f'webhooks are server-wide: set {", ".join(hooks)} with project=""'
        raise RequestValidationError([{"type": "value_error", "loc": ("query", "project"), "msg": message}])
    save(session.connection(), project, changes)  # the body's bounds are those Thresholds.checked holds
    session.commit()
    return _settings(request, session, project)
