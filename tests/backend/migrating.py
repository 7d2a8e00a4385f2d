"""Downgrading a test's database to an earlier revision, as a migration test needs."""

from alembic import command
from sqlalchemy import Engine

from packscope.backend.store.db import WRITES, alembic_config, retrying_deadlocks


def downgrade(engine: Engine, revision: str) -> None:
    """`alembic downgrade <revision>` in one transaction on `engine`'s database.

    IMMEDIATE on SQLite (WRITES), as upgrade_schema's is: a deferred transaction that reads and then
    writes fails at once ("database is locked", no busy wait) where a started app's background work
    (the alerts worker) wrote in between. On PostgreSQL that work's reads can deadlock with the
    downgrade's exclusive locks: done again then, as upgrade_schema is.
    """

    def once() -> None:
        config = alembic_config()
        with engine.execution_options(**{WRITES: True}).begin() as connection:
            config.attributes["connection"] = connection
            command.downgrade(config, revision)

    retrying_deadlocks(once)
