"""Alembic environment: migrates the packscope schema on SQLite or PostgreSQL.

The database comes from, in order: a connection handed over by the server
(`config.attributes["connection"]`), `sqlalchemy.url` in the Alembic config, or
PACKSCOPE_DATABASE_URL.
"""

from logging.config import fileConfig

from alembic import context
from sqlalchemy.engine import Connection

from packscope.backend.http.settings import Settings
from packscope.backend.store.db import make_engine
from packscope.backend.store.models import Base

config = context.config
# Only the command line configures logging; the server keeps its own.
if config.config_file_name is not None and config.attributes.get("connection") is None:
    fileConfig(config.config_file_name)

target_metadata = Base.metadata


def _url() -> str:
    return config.get_main_option("sqlalchemy.url") or Settings().database_url


def _migrate(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        # SQLite cannot ALTER most things in place; batch mode copies the table instead.
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_offline() -> None:
    """`alembic upgrade head --sql`: print the SQL instead of running it."""
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _migrate(connection)
        return
    engine = make_engine(_url())
    try:
        with engine.connect() as connection:
            _migrate(connection)
            connection.commit()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
