"""`packscope serve`: the dashboard and ingest server. The backend and its libraries (the server
extra) are imported only once the arguments parsed, so that `packscope serve --help` answers
without them."""

import argparse
import os
import socket
import sys


def _fail(message: str) -> int:
    print(f"packscope: {message}", file=sys.stderr)
    return 2


def cannot_listen(host: str, port: int) -> OSError | None:
    """Why `host:port` cannot be bound as uvicorn binds it (SO_REUSEADDR), or None: a busy port is
    said before a database is created or migrated and before a dashboard URL is printed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, port))
        except OSError as exc:
            return exc
    return None


def add_serve_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--host", default="127.0.0.1", help="interface to listen on (default: %(default)s; 0.0.0.0 for all)"
    )
    parser.add_argument("--port", type=int, default=8000, help="port (default: %(default)s)")
    parser.add_argument(
        "--database-url",
        default=None,
        help="SQLAlchemy URL, e.g. sqlite:///./packscope.db or postgresql+psycopg://user@host/db "
        "(default: PACKSCOPE_DATABASE_URL, else sqlite:///./packscope.db)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=default_workers(),
        help="server processes (default: %(default)s, one per core up to 4); SQLite serves several "
        "through WAL and its busy timeout",
    )
    parser.add_argument("--no-access-log", action="store_true", help="do not log every request")
    alerts = parser.add_argument_group("alerts (docs/alerts.md; each flag sets its PACKSCOPE_* variable)")
    alerts.add_argument(
        "--alert-webhook-url",
        action="append",
        default=None,
        metavar="URL",
        help="a webhook to send each alert's open and resolve to (repeat for several; PACKSCOPE_ALERT_WEBHOOK_URL)",
    )
    alerts.add_argument("--alert-webhook-secret", default=None, help="signs each message (X-Packscope-Signature)")
    alerts.add_argument("--alert-webhook-format", choices=("json", "slack"), default=None, help="default: json")
    alerts.add_argument("--alert-thresholds", default=None, metavar="JSON", help="e.g. '{\"slowdown_pct\": 30}'")
    alerts.add_argument("--public-url", default=None, help="the dashboard's address as receivers reach it (run_url)")


# The alert flags, each as the variable the workers' settings read.
_ALERT_FLAGS = {
    "alert_webhook_url": "PACKSCOPE_ALERT_WEBHOOK_URL",
    "alert_webhook_secret": "PACKSCOPE_ALERT_WEBHOOK_SECRET",
    "alert_webhook_format": "PACKSCOPE_ALERT_WEBHOOK_FORMAT",
    "alert_thresholds": "PACKSCOPE_ALERT_THRESHOLDS",
    "public_url": "PACKSCOPE_PUBLIC_URL",
}


def default_workers() -> int:
    return max(1, min(4, os.cpu_count() or 1))


def shown_url(url: str) -> str:
    """A database URL fit for a banner or a log: the password masked."""
    from sqlalchemy.engine import make_url

    try:
        return make_url(url).render_as_string(hide_password=True)
    except Exception:  # noqa: BLE001 - not a URL at all: SQLAlchemy says so when the server starts
        return "<unparsable URL>"


def serve_from_args(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError
    from sqlalchemy.exc import SQLAlchemyError

    from packscope.backend.http.settings import Settings
    from packscope.backend.server.serving import SUPERVISOR_PID, uvicorn_options
    from packscope.backend.store.db import make_engine, upgrade_schema

    if args.workers < 1:
        return _fail(f"--workers must be at least 1, got {args.workers}")
    if args.database_url:
        # Worker processes build their app from the environment (create_app's default settings).
        os.environ["PACKSCOPE_DATABASE_URL"] = args.database_url
    for flag, variable in _ALERT_FLAGS.items():
        value = getattr(args, flag, None)
        if value is not None:
            os.environ[variable] = ",".join(value) if isinstance(value, list) else value
    try:
        settings = Settings()
    except ValidationError as exc:
        return _fail("; ".join(str(error["msg"]).removeprefix("Value error, ") for error in exc.errors()))
    busy = cannot_listen(args.host, args.port)
    if busy is not None:
        return _fail(
            f"cannot listen on {args.host}:{args.port} ({busy.strerror or busy}); stop what runs there or pass --port"
        )
    shown = shown_url(settings.database_url)
    try:
        # Migrate here, so that a database that cannot be opened is said once, not once per worker
        # (each worker's app migrates again: a no-op, serialised by the migration lock).
        engine = make_engine(settings.database_url)
        upgrade_schema(engine)
        engine.dispose()
    except (SQLAlchemyError, ValueError, OSError) as exc:
        reason = getattr(exc, "orig", None) or exc  # the driver's message, without SQLAlchemy's boilerplate
        return _fail(f"cannot open or migrate the database {shown}: {reason}; check --database-url")
    where = f"http://{args.host}:{args.port}/"
    print(f"packscope: dashboard at {where} (database {shown}, {args.workers} worker(s))", file=sys.stderr)
    if settings.writes_open:
        print(
            "packscope: WRITES ARE OPEN (no PACKSCOPE_INGEST_TOKEN): anyone who reaches "
            f"{args.host}:{args.port} can add, change and delete runs",
            file=sys.stderr,
        )
    factory = "packscope.backend.server.app:create_app"
    if args.workers > 1:
        factory = "packscope.backend.server.serving:worker_app"  # workers that die with this process
        os.environ[SUPERVISOR_PID] = str(os.getpid())
    uvicorn.run(
        factory,
        factory=True,
        host=args.host,
        port=args.port,
        workers=args.workers,
        access_log=not args.no_access_log,
        **uvicorn_options(settings, workers=args.workers),
    )
    return 0
