"""Server configuration, read from PACKSCOPE_* environment variables."""

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from packscope.backend.alerts.config import AlertConfig


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PACKSCOPE_", extra="ignore")

    # SQLite is the embedded default; use postgresql+psycopg://user@host/db for a shared server.
    database_url: str = "sqlite:///./packscope.db"
    # When set, writes (the agent, and the runs page's edits) must send `Authorization: Bearer <token>`.
    # Unset, anyone who reaches the server can write: it says so at start and on every page.
    ingest_token: str | None = None
    # When set, reads need `Authorization: Bearer <token>` (or the sign-in cookie) too; then the
    # ingest token must be set as well (a server with closed reads and open writes refuses to start).
    read_token: str | None = None
    # Measured after gzip decompression, so a small compressed body cannot expand without bound.
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # POST /api/v1/runs: a config is at most 256 KiB, so a run body past this is refused before
    # it is parsed.
    max_run_body_bytes: int = Field(default=1024 * 1024, ge=1024)
    # Where no cross-process wake-up exists (no unix sockets), the live stream polls this often;
    # it sends a keep-alive comment (and re-reads the run's state) this often in any case.
    stream_poll_s: float = Field(default=1.0, gt=0)
    stream_keepalive_s: float = Field(default=15.0, gt=0)
    # Requests that use the database at once, per worker process; the connection pool holds as
    # many connections (plus half as many for ones on their way back).
    db_slots: int = Field(default=10, ge=1, le=200)
    # How long a request may wait for a slot, and for a pooled connection, before it is answered
    # 503 with Retry-After: a burst is shed quickly instead of stalling.
    queue_wait_s: float = Field(default=0.5, gt=0)
    pool_wait_s: float = Field(default=2.0, gt=0)
    # SQLite: how long a write waits for another process's write lock before 503.
    sqlite_busy_s: float = Field(default=5.0, gt=0)
    retry_after_s: int = Field(default=1, ge=1)
    # Interval records stored together at most: batches that arrive while others are being stored
    # share one transaction up to this many records (a single larger batch is stored alone).
    coalesce_rows: int = Field(default=2048, ge=1)
    # Failed and successful sign-ins per client address and minute, beyond which 429 is answered.
    sign_in_per_minute: int = Field(default=10, ge=1)
    # Wrong bearer tokens (or sign-in cookies) per client address and minute on the API, beyond
    # which every request of that client is answered 429 until the minute has passed.
    token_failures_per_minute: int = Field(default=20, ge=1)
    # Comma-separated addresses of reverse proxies whose X-Forwarded-For / X-Forwarded-Proto are
    # believed ("*" for any). Empty: the client address is the TCP peer, whatever headers say.
    trusted_proxies: str = ""
    # Comma-separated origins (scheme://host[:port]) besides the server's own that may write
    # from a browser; every other cross-origin write is refused (403).
    allowed_origins: str = ""
    # CSV exports streaming at once, in all and per client address (per worker process).
    csv_streams: int = Field(default=8, ge=1)
    csv_streams_per_client: int = Field(default=2, ge=1)
    # A client must send a request's head within this many seconds of connecting (or of the last
    # answer on a kept-alive connection), and its body within the second limit once the head is in.
    request_head_timeout_s: float = Field(default=10.0, gt=0)
    request_body_timeout_s: float = Field(default=60.0, gt=0)
    # An idle kept-alive connection is closed after this many seconds.
    keep_alive_s: int = Field(default=5, ge=1)
    # Alerts (docs/alerts.md). Webhook URLs (comma-separated; the API can replace them), the secret
    # that signs each message (X-Packscope-Signature), and its format: json or slack.
    alert_webhook_url: str = ""
    alert_webhook_secret: str | None = None
    alert_webhook_format: str = "json"
    # The rules' thresholds as a JSON object over their defaults, e.g. {"slowdown_pct": 30}.
    alert_thresholds: str = ""
    # The server's address as webhook receivers reach it (each message's run_url); "" gives a path.
    public_url: str = ""
    # How often live runs are judged without new data (stalled, crashed), and the outbox polled.
    alert_sweep_s: float = Field(default=5.0, gt=0)
    alert_judge_gap_s: float = Field(default=1.0, gt=0)
    alert_delivery_poll_s: float = Field(default=1.0, gt=0)
    # A failed webhook message waits base·2^(attempts-1) seconds before its next try, at most max.
    alert_retry_base_s: float = Field(default=2.0, gt=0)
    alert_retry_max_s: float = Field(default=300.0, gt=0)

    @field_validator("ingest_token", "read_token")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        # `PACKSCOPE_INGEST_TOKEN=` (as docker compose passes an unset variable) means no token.
        return value or None

    @model_validator(mode="after")
    def _reads_closed_means_writes_closed(self) -> "Settings":
        if self.read_token is not None and self.ingest_token is None:
            raise ValueError(
                "PACKSCOPE_READ_TOKEN is set but PACKSCOPE_INGEST_TOKEN is not: reads would be closed while "
                "anyone could still create, change and delete runs; set PACKSCOPE_INGEST_TOKEN too "
                "(the agents and the runs page's edits send it)"
            )
        return self

    @model_validator(mode="after")
    def _alerts_readable(self) -> "Settings":
        self.alert_config()  # raises ValueError naming what is wrong
        return self

    def alert_config(self) -> AlertConfig:
        return AlertConfig.of(
            self.alert_thresholds,
            self.alert_webhook_url,
            self.alert_webhook_secret,
            self.alert_webhook_format,
            self.public_url,
            sweep_s=self.alert_sweep_s,
            judge_gap_s=self.alert_judge_gap_s,
            delivery_poll_s=self.alert_delivery_poll_s,
            retry_base_s=self.alert_retry_base_s,
            retry_max_s=self.alert_retry_max_s,
        )

    @property
    def writes_open(self) -> bool:
        return self.ingest_token is None

    @property
    def trusted_proxy_list(self) -> list[str]:
        return _listed(self.trusted_proxies)

    @property
    def allowed_origin_set(self) -> frozenset[str]:
        return frozenset(origin.rstrip("/").lower() for origin in _listed(self.allowed_origins))


def _listed(value: str) -> list[str]:
    return [item.strip() for item in value.split(",") if item.strip()]
