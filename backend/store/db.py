"""Engine, session factories and schema upgrades for SQLite (embedded default) and PostgreSQL."""

import json
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any, TypeVar

import msgspec
from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

import packscope.migrations

log = logging.getLogger(__name__)
T = TypeVar("T")

# Execution option that marks a write session's connections (SQLite starts them BEGIN IMMEDIATE).
WRITES = "packscope_writes"


# WAL lets the dashboard read while the agent writes; SQLite leaves foreign keys off by default.
SQLITE_PRAGMAS = ("PRAGMA journal_mode=WAL", "PRAGMA synchronous=NORMAL", "PRAGMA foreign_keys=ON")


def _json_loads(text: str | bytes) -> Any:
    """A JSON column's value, as json.loads reads it: by msgspec, in C (the runs list reads four
    JSON columns a run), and by json where msgspec refuses the text (NaN or Infinity, which
    json.dumps writes and a run's config may hold; a number beyond float range; a lone surrogate)."""
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        return json.loads(text)


def make_engine(url: str, *, pool_size: int = 10, pool_timeout_s: float = 2.0, sqlite_busy_s: float = 5.0) -> Engine:
    """An engine for `url`; `postgresql://` URLs are pointed at the psycopg 3 driver.

    The pool holds `pool_size` connections plus half as many again for connections on their way
    back; a request that still finds none within `pool_timeout_s` fails with sqlalchemy's
    TimeoutError, which the app answers 503 (never a wait without end).
    """
    parsed = make_url(url)
    if parsed.drivername in ("postgresql", "postgres"):
        parsed = parsed.set(drivername="postgresql+psycopg")
    pool = {"pool_size": pool_size, "max_overflow": max(pool_size // 2, 2), "pool_timeout": pool_timeout_s}
    if parsed.get_backend_name() != "sqlite":
        return create_engine(parsed, pool_pre_ping=True, json_deserializer=_json_loads, **pool)
    if parsed.database in (None, "", ":memory:"):
        raise ValueError("an in-memory SQLite database is private to one connection; give a file path")

    # A session is opened in the event loop, used in a worker thread and closed in another.
    # `timeout` is SQLite's busy timeout: a writer that finds the file locked (another worker
    # process writing) waits that long before "database is locked" (answered 503).
    engine = create_engine(
        parsed,
        connect_args={"check_same_thread": False, "timeout": sqlite_busy_s},
        json_deserializer=_json_loads,
        **pool,
    )

    @event.listens_for(engine, "connect")
    def _sqlite_pragmas(dbapi_connection, _record) -> None:
        # The driver's own BEGIN would be deferred; transactions are begun in _begin below.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        for pragma in SQLITE_PRAGMAS:
            cursor.execute(pragma)
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection: Connection) -> None:
        # A deferred transaction that reads and then writes fails at once ("database is locked",
        # no busy wait) when another process wrote in between; IMMEDIATE takes the write lock
        # first, waiting up to the busy timeout.
        # On sqlite3 itself (run_sql): SQLAlchemy's execution layer cost CPU on every transaction
        # here (docs/benchmarks/2026-11-30-2core.md#dev-2026-11-30-1704-ingest-night). Errors are
        # still SQLAlchemy's ("database is locked" after the busy timeout is answered 503, errors.py).
        sql = "BEGIN IMMEDIATE" if connection.get_execution_options().get(WRITES, False) else "BEGIN"
        run_sql(connection, sql, ())

    return engine


def run_sql(connection: Connection, sql: str, parameters: Sequence[Any], *, many: bool = False) -> list[Any]:
    """Run the driver's own SQL in the connection's transaction; the rows it returns, as tuples.

    Straight on the driver's connection: SQLAlchemy's execution layer (with the engine's event
    listeners) cost more a statement than most of the statements of a batch
    (docs/benchmarks/2026-11-30-2core.md#dev-2026-11-30-1533-ingest-evening). A driver error is
    raised as SQLAlchemy raises it (OperationalError, IntegrityError, ...), which the app's
    handlers answer as they answer any other (errors.py); a lost connection is invalidated, so
    the pool opens a new one."""
    driver = connection.connection.driver_connection
    assert driver is not None
    dbapi_error = connection.dialect.loaded_dbapi.Error
    cursor = driver.cursor()
    try:
        if many:
            cursor.executemany(sql, parameters)
        else:
            cursor.execute(sql, tuple(parameters))
        return cursor.fetchall() if cursor.description else []
    except dbapi_error as exc:
        lost = connection.dialect.is_disconnect(exc, driver, cursor)
        if lost:
            connection.invalidate(exc)
        raise DBAPIError.instance(
            sql, None, exc, dbapi_error, hide_parameters=True, connection_invalidated=lost
        ) from exc
    finally:
        cursor.close()


def make_sessionmaker(engine: Engine, *, writes: bool = False) -> sessionmaker[Session]:
    # Rows are turned into dicts right after queries; expiring them on commit would only cost reloads.
    bind = engine.execution_options(**{WRITES: True}) if writes else engine
    return sessionmaker(bind, expire_on_commit=False)


def alembic_config() -> Config:
    """Alembic settings that find the migrations inside the installed package, not the checkout."""
    config = Config()
    config.set_main_option("script_location", str(Path(packscope.migrations.__file__).parent))
    return config


# pg_advisory_xact_lock's key for migrations: any constant that no other application on the
# same PostgreSQL server is likely to use ("packscop" in ASCII).
MIGRATION_LOCK_KEY = 0x7061636B73636F70


@contextmanager
def _sqlite_migration_lock(engine: Engine) -> Iterator[None]:
    """An exclusive lock on `<database>.migrate-lock` beside the database, held while migrating:
    servers that start together migrate one after the other, and the later ones find nothing to
    do. (SQLite's own write lock would make them fail with "database is locked" instead.)"""
    database = engine.url.database
    assert database
    try:
        import fcntl
    except ImportError:  # Windows: no flock; starting one server at a time is up to the user
        yield
        return
    with open(f"{database}.migrate-lock", "a+b") as lock_file:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)


def upgrade_schema(engine: Engine, revision: str = "head") -> None:
    """`alembic upgrade <revision>` on `engine`'s database, in one transaction, serialised with
    every other process migrating the same database (a file lock on SQLite, an advisory lock on
    PostgreSQL held until the transaction ends), so any number of servers can start at once.

    On SQLite, foreign keys are off while migrating: a batch migration rebuilds a table (create,
    copy, drop the old one), and with foreign keys on, dropping the old `runs` or `intervals`
    would cascade-delete every row that refers to it. The keys are checked before committing.
    At head, the runs' kept metrics are then brought up to date (store/metric_values.refresh).
    """
    sqlite = engine.dialect.name == "sqlite"
    # The file lock covers the refresh too: servers started together on SQLite then take the
    # write lock one after another instead of racing the busy timeout (one of four starts failed
    # with "database is locked" on a loaded machine, the others' no-op migrations in between).
    with _sqlite_migration_lock(engine) if sqlite else nullcontext():
        retrying_deadlocks(lambda: _migrate(engine, revision, sqlite))
        if revision == "head":
            # The runs' kept metrics, which a migration cannot compute (it may not import the
            # catalogue): here, so that the first metric sort after an upgrade (runs stored before
            # 0019, formulas changed since) does not compute every run's.
            from packscope.backend.store.metric_values import refresh  # imports this module

            retrying_deadlocks(lambda: refresh(engine, everything=True))


def _migrate(engine: Engine, revision: str, sqlite: bool) -> None:
    config = alembic_config()
    # WRITES: BEGIN IMMEDIATE on SQLite (_begin): a migration writes, and a deferred transaction
    # that has read fails at once where another connection wrote in between (a running app's).
    with engine.execution_options(**{WRITES: True}).connect() as connection:
        # On the driver's connection, before SQLAlchemy begins: inside a transaction it is a no-op.
        driver = connection.connection.driver_connection
        assert driver is not None  # a live connection from the pool
        if sqlite:
            driver.execute("PRAGMA foreign_keys=OFF")
        try:
            with connection.begin():
                if not sqlite:
                    connection.exec_driver_sql(f"SELECT pg_advisory_xact_lock({MIGRATION_LOCK_KEY})")
                config.attributes["connection"] = connection  # env.py migrates through this connection
                command.upgrade(config, revision)
                if sqlite and connection.exec_driver_sql("PRAGMA foreign_key_check").first() is not None:
                    raise RuntimeError("the migration left rows whose foreign keys point nowhere; nothing was changed")
        finally:
            if sqlite:
                driver.execute("PRAGMA foreign_keys=ON")


# PostgreSQL's SQLSTATE for a deadlock: it rolled back one of the transactions, ours.
_DEADLOCK = "40P01"
DEADLOCK_RETRIES = 5


def retrying_deadlocks(work: Callable[[], T]) -> T:
    """`work()`, again where PostgreSQL chose its transaction as a deadlock's victim.

    A migration takes exclusive locks table by table while a running server's readers (the
    alerts worker, a page) take shared ones in another order; PostgreSQL then rolls one back.
    The whole transaction was undone, so doing it again is safe; after DEADLOCK_RETRIES it is raised."""
    for attempt in range(DEADLOCK_RETRIES + 1):
        try:
            return work()
        except OperationalError as exc:
            if getattr(exc.orig, "sqlstate", None) != _DEADLOCK or attempt == DEADLOCK_RETRIES:
                raise
            log.warning("a deadlock rolled the migration back; trying again (%d of %d)", attempt + 1, DEADLOCK_RETRIES)
            time.sleep(0.05 * 2**attempt)
    raise AssertionError("unreachable")
