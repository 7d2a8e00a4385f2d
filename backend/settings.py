"""Server configuration, read from PACKSCOPE_* environment variables."""

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="PACKSCOPE_", extra="ignore")

    # SQLite is the embedded default; use postgresql+psycopg://user@host/db for a shared server.
    database_url: str = "sqlite:///./packscope.db"
    # When set, writes (the agent) must send `Authorization: Bearer <token>`.
    ingest_token: str | None = None
    # When set, reads need `Authorization: Bearer <token>` too.
    read_token: str | None = None
    # Measured after gzip decompression, so a small compressed body cannot expand without bound.
    max_body_bytes: int = Field(default=8 * 1024 * 1024, ge=1024)
    # The live stream polls the database this often and sends a keep-alive comment this often.
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

    @field_validator("ingest_token", "read_token")
    @classmethod
    def _empty_is_unset(cls, value: str | None) -> str | None:
        # `PACKSCOPE_INGEST_TOKEN=` (as docker compose passes an unset variable) means no token.
        return value or None
