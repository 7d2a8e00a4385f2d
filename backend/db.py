"""Engine, session factory and schema upgrades for SQLite (embedded default) and PostgreSQL."""

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker

import packscope.migrations


def make_engine(url: str) -> Engine:
    """An engine for `url`; `postgresql://` URLs are pointed at the psycopg 3 driver."""
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    if parsed.get_backend_name() != "sqlite":
        return create_engine(parsed, pool_pre_ping=True)

    # Requests run in a thread pool, so one connection may be used from several threads.
    engine = create_engine(parsed, connect_args={"check_same_thread": False, "timeout": 30})

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection, _record) -> None:
        cursor = dbapi_connection.cursor()
        # WAL lets the dashboard read while the agent writes; SQLite leaves foreign keys off by default.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.close()

    return engine


def make_sessionmaker(engine: Engine) -> sessionmaker[Session]:
    # Rows are turned into dicts right after queries; expiring them on commit would only cost reloads.
    return sessionmaker(engine, expire_on_commit=False)


def alembic_config() -> Config:
    """Alembic settings that find the migrations inside the installed package, not the checkout."""
    config = Config()
    config.set_main_option("script_location", str(Path(packscope.migrations.__file__).parent))
    return config


def upgrade_schema(engine: Engine) -> None:
    """`alembic upgrade head` on `engine`'s database."""
    config = alembic_config()
    with engine.begin() as connection:
        config.attributes["connection"] = connection  # env.py migrates through this connection
        command.upgrade(config, "head")
