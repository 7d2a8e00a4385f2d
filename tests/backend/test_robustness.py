"""Input the schema cannot take is a 4xx naming the field, and changes nothing; a database that
is down, read-only or locked is a 503 with Retry-After, never a 500 or a traceback."""

import sqlite3
from typing import Any

import pytest
from sqlalchemy import event

RUNS = "/api/v1/runs"


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels - 1):
        value = {"a": value}
    return value


BAD_RUN_BODIES = {
    "config 300 levels deep": ({"config": deep(300)}, "config"),
    "config over 256 KiB": ({"config": {"x": "y" * 300_000}}, "config"),
    "NaN in config": ({"config": {"lr": float("nan")}}, "config"),
    "NUL in name": ({"name": "a\x00b"}, "name"),
    "lone surrogate in project": ({"project": "\ud800"}, "project"),
    "lone surrogate in a tag": ({"tags": ["ok", "\udfff"]}, "tags"),
    "NUL in a config key": ({"config": {"k\x00": 1}}, "config"),
    "lone surrogate in gpu_name": ({"hardware": {"gpu_name": "\ud83d"}}, "hardware"),
    "string for a count": ({"parallel": {"dp": "8"}}, "parallel"),
    "true for a count": ({"hardware": {"gpu_count": True}}, "hardware"),
    "string for a model size": (
        {"model": {"layers": "4", "hidden": 256, "heads": 8, "ffn": 688, "vocab": 32000}},
        "model",
    ),
    "a model beyond any real one": (
        {"model": {"layers": 2**40, "hidden": 256, "heads": 8, "ffn": 688, "vocab": 32000}},
        "model",
    ),
}


def raw_json(body: dict[str, Any]) -> bytes:
    # ensure_ascii keeps lone surrogates as \ud800 escapes, as a buggy client would send them.
    import json

    return json.dumps(body, ensure_ascii=True).encode()


@pytest.mark.parametrize("case", list(BAD_RUN_BODIES))
def test_a_run_body_the_schema_cannot_take_is_422_and_stores_nothing(make_client, database_url, new_run, case):
    client = make_client(database_url)
    change, field = BAD_RUN_BODIES[case]
    answer = client.post(RUNS, content=raw_json(new_run(**change)), headers={"content-type": "application/json"})
    assert answer.status_code == 422, answer.text
    assert any(field in map(str, error["loc"]) for error in answer.json()["detail"]), answer.text
    assert client.get(RUNS).json() == {"runs": [], "total": 0}
    assert client.get(RUNS).status_code == 200


def test_a_config_64_levels_deep_is_stored_and_read_back(make_client, database_url, new_run):
    client = make_client(database_url)
    assert client.post(RUNS, json=new_run(config=deep(64))).status_code == 201
    assert client.get(RUNS).status_code == 200


def test_a_config_is_read_back_as_it_was_sent(make_client, database_url, new_run):
    """JSON columns are read by msgspec (store/db.py): every value comes back as json reads it."""
    import json

    config = {"big": 2**70, "small": -(2**70), "edge": 1e300, "tiny": 5e-324, "text": "é☃\u2028", "deep": [[1.5, None]]}
    client = make_client(database_url)
    assert (
        client.post(
            RUNS, content=json.dumps(new_run(config=config)), headers={"content-type": "application/json"}
        ).status_code
        == 201
    )
    assert client.get(f"{RUNS}/run-1").json()["config"] == json.loads(json.dumps(config))


@pytest.mark.parametrize(
    "text", ['{"lr": NaN}', '{"x": 1e400}', '"\\ud800"', '{"big": 123456789012345678901234567890}']
)
def test_json_text_msgspec_refuses_is_read_as_json_reads_it(text):
    """Text an older version may have stored (NaN), or any msgspec refuses, is still read."""
    import json
    import math

    from packscope.backend.store.db import _json_loads

    got, want = _json_loads(text), json.loads(text)
    assert repr(got) == repr(want) or (math.isnan(got["lr"]) and math.isnan(want["lr"]))


@pytest.mark.parametrize(
    "path",
    [
        "/api/v1/runs/run-1/series?step_max=9223372036854775808",
        "/api/v1/runs/run-1/series?step_min=-1",
        "/api/v1/runs/run-1/histograms?interval=2147483648",
        "/api/v1/runs/run-1/histograms?interval=99999999999999999999999",
        "/api/v1/runs/run-1/sync-sites?limit=0",
        "/api/v1/compare?run_id=run-1&window=1",
    ],
)
def test_query_parameters_out_of_range_are_422(make_client, database_url, new_run, path):
    client = make_client(database_url)
    client.post(RUNS, json=new_run())
    answer = client.get(path)
    assert answer.status_code == 422, (path, answer.status_code, answer.text)


@pytest.mark.parametrize("run_id", ["a%00b", "%ED%A0%80", "%FF"])
def test_strange_run_ids_in_the_path_are_404_or_422_not_500(make_client, database_url, run_id):
    client = make_client(database_url)
    for path in (f"/api/v1/runs/{run_id}", f"/api/v1/runs/{run_id}/series", f"/api/v1/compare?run_id={run_id}"):
        assert client.get(path).status_code in (404, 422), path


def test_a_read_only_database_is_503_with_retry_after_and_a_message(make_client, sqlite_url, new_run):
    client = make_client(sqlite_url)
    client.get(RUNS)
    engine = client.app.state.engine
    engine.dispose()

    def read_only(dbapi_connection, _record):
        # What SQLite answers after a read-only remount, and also as root (which file modes do not stop).
        dbapi_connection.execute("PRAGMA query_only=ON")

    event.listen(engine, "connect", read_only)
    try:
        answer = client.post(RUNS, json=new_run())
    finally:
        event.remove(engine, "connect", read_only)
        engine.dispose()
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"].isdigit()
    assert "read-only" in answer.json()["detail"]
    assert client.post(RUNS, json=new_run()).status_code == 201  # writable again, nothing half-stored


def test_a_locked_database_is_503_with_retry_after(make_client, sqlite_url, new_run):
    client = make_client(sqlite_url, sqlite_busy_s=0.2)
    client.get(RUNS)
    holder = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")  # another process is writing, for longer than the busy timeout
    try:
        answer = client.post(RUNS, json=new_run())
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"] == "1"
    assert "busy" in answer.json()["detail"]
    assert client.post(RUNS, json=new_run()).status_code == 201  # and it works again at once


@pytest.mark.postgres
def test_postgresql_going_away_is_503_then_recovers(make_client, postgres, new_run):
    import psycopg

    from tests.backend.conftest import PG_ADMIN  # noqa: F401  (same server as the fixture)

    client = make_client(postgres, pool_wait_s=1.0)
    assert client.post(RUNS, json=new_run()).status_code == 201
    name = postgres.rsplit("/", 1)[1]
    with psycopg.connect("host=127.0.0.1 port=5432 user=postgres dbname=postgres", autocommit=True) as admin:
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS false')
        admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s", (name,))
        answer = client.get(RUNS)
        admin.execute(f'ALTER DATABASE "{name}" ALLOW_CONNECTIONS true')
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"].isdigit()
    assert "unavailable" in answer.json()["detail"]
    assert client.get(RUNS).status_code == 200


def test_a_batch_refused_by_a_read_only_database_is_503_and_stores_nothing(make_client, sqlite_url, new_run, records):
    # The batch's statements run on sqlite3 itself (db.run_sql); its errors still reach the
    # app's handlers as SQLAlchemy's. The database turns read-only once the transaction has begun,
    # so the refusal comes from the batch's own statements.
    client = make_client(sqlite_url)
    assert client.post(RUNS, json=new_run()).status_code == 201
    engine = client.app.state.engine

    def read_only(connection):
        connection.connection.driver_connection.execute("PRAGMA query_only=ON")

    event.listen(engine, "begin", read_only)
    try:
        answer = client.post(f"{RUNS}/run-1/intervals", json={"intervals": records(3)})
    finally:
        event.remove(engine, "begin", read_only)
        engine.dispose()
    assert answer.status_code == 503, answer.text
    assert answer.headers["retry-after"].isdigit()
    assert "read-only" in answer.json()["detail"]
    assert client.get(f"{RUNS}/run-1").json()["records"] == 0
    assert client.post(f"{RUNS}/run-1/intervals", json={"intervals": records(3)}).json()["accepted"] == 3


@pytest.mark.postgres
def test_the_driver_sql_of_a_batch_on_postgresql_fails_as_sqlalchemys_own(postgres):
    """db.run_sql runs on psycopg's connection, not through SQLAlchemy's execution layer (no
    execution events); a driver error is still raised as SQLAlchemy wraps it, and a lost
    connection is noticed as SQLAlchemy notices it: invalidated, the next transaction on a new one."""
    from sqlalchemy import event
    from sqlalchemy import exc as sa

    from packscope.backend.store.db import make_engine, run_sql

    engine = make_engine(postgres)
    executed: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: executed.append(a[2]))
    try:
        with engine.begin() as connection:
            assert run_sql(connection, "SELECT %s::int + 1", (41,)) == [(42,)]
            with pytest.raises(sa.DataError, match="division by zero"):
                run_sql(connection, "SELECT 1 / %s::int", (0,))
        with pytest.raises(sa.OperationalError) as lost, engine.begin() as connection:
            pid = run_sql(connection, "SELECT pg_backend_pid()", ())[0][0]
            run_sql(connection, "SELECT pg_terminate_backend(%s)", (pid,))
        assert lost.value.connection_invalidated
        with engine.begin() as connection:
            assert run_sql(connection, "SELECT pg_backend_pid()", ())[0][0] != pid
        assert executed == []
    finally:
        engine.dispose()


def test_sqlite_transactions_begin_on_sqlite3_itself_with_sqlalchemys_errors(sqlite_url):
    """db.py's BEGIN [IMMEDIATE] goes to sqlite3 directly (no execution events, about 10 µs less a
    transaction); a write that finds the file locked past the busy timeout still fails with
    SQLAlchemy's OperationalError, which the app answers 503."""
    from sqlalchemy import exc as sa

    from packscope.backend.store.db import WRITES, make_engine

    engine = make_engine(sqlite_url, sqlite_busy_s=0.05)
    executed: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: executed.append(a[2]))
    writes = engine.execution_options(**{WRITES: True})
    try:
        with writes.begin() as connection:
            connection.connection.driver_connection.execute("CREATE TABLE t (x)")
        with engine.begin() as connection:
            assert connection.connection.driver_connection.in_transaction
        assert executed == []
        holder = sqlite3.connect(sqlite_url.removeprefix("sqlite:///"), isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
        try:
            with pytest.raises(sa.OperationalError, match="locked"), writes.begin():
                pass
        finally:
            holder.execute("ROLLBACK")
            holder.close()
        with writes.begin() as connection:
            connection.connection.driver_connection.execute("INSERT INTO t VALUES (1)")
    finally:
        engine.dispose()


@pytest.mark.parametrize("part", ["channel_loss", "channel_tokens"])
def test_a_lone_surrogate_in_a_key_the_422_names_is_written_as_valid_utf8(client, run, records, part):
    """The 422's `loc` names the channel, a key UTF-8 cannot encode (a JSON "\\udfff" escape): the
    answer writes it out as its escape instead of failing to encode itself (a 500)."""
    import json

    record = records(1)[0]
    record[part] = {"\udfff": 1}
    answer = client.post(
        f"{RUNS}/run-1/intervals",
        content=raw_json({"intervals": [record]}),
        headers={"content-type": "application/json"},
    )
    assert answer.status_code == 422, answer.text
    (error,) = json.loads(answer.content.decode("utf-8"))["detail"]  # strict UTF-8
    assert error["loc"] == ["body", "intervals", 0, part, "\\udfff"] and "lone surrogate" in error["msg"]
    assert client.get(f"{RUNS}/run-1").json()["records"] == 0
