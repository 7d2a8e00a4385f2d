"""What the agent tells the server beside its records (backend/ingest/contact.py) and what the reads make
of it: heartbeats and the status shown (running, stale, crashed, revived), the layout found in the
batches, refused intervals, the windows the numbers cover, and picked config values."""

import time
from typing import Any

import pytest

from packscope.backend.reads import liveness
from tests.backend.migrating import downgrade


def make_run(client, new_run, run_id: str = "run-1", **overrides: Any) -> dict[str, Any]:
    response = client.post("/api/v1/runs", json=new_run(run_id, **overrides))
    assert response.status_code == 201, response.text
    return response.json()


def status_of(client, run_id: str = "run-1") -> str:
    return client.get(f"/api/v1/runs/{run_id}").json()["status"]


def listed(client, **params: Any) -> list[str]:
    response = client.get("/api/v1/runs", params=params)
    assert response.status_code == 200, response.text
    return [r["run_id"] for r in response.json()["runs"]]


def wait_for(condition, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.alone  # a status read 0.75 s after a post: a busy machine's slow request reads stale
def test_a_run_whose_heartbeats_stop_goes_stale_then_crashed_and_contact_revives_it(
    make_client, database_url, new_run, records
):
    client = make_client(database_url)
    make_run(client, new_run)
    beat = 0.25  # stale after 3 missed beats (0.75 s), crashed after 10 (2.5 s)
    assert client.post("/api/v1/runs/run-1/heartbeat", json={"every_s": beat}).status_code == 204
    run = client.get("/api/v1/runs/run-1").json()
    assert run["status"] == "running" and run["heartbeat_s"] == beat
    contact = run["last_contact_at"]
    assert listed(client, status="running") == ["run-1"] and listed(client, status="stale") == []

    wait_for(lambda: status_of(client) == "stale", 5, "stale")
    assert listed(client, status="stale") == ["run-1"] and listed(client, status="running") == []
    assert client.get("/api/v1/runs/run-1").json()["last_contact_at"] == contact  # the time it was last heard
    wait_for(lambda: status_of(client) == "crashed", 10, "crashed")
    assert listed(client, status="crashed") == ["run-1"] and listed(client, status="stale") == []

    # A record is contact: the run is running again.
    batch = {"intervals": records(1)}
    assert client.post("/api/v1/runs/run-1/intervals", json=batch).json()["accepted"] == 1
    assert status_of(client) == "running"
    wait_for(lambda: status_of(client) == "stale", 5, "stale again")
    # So is a heartbeat.
    assert client.post("/api/v1/runs/run-1/heartbeat", json={"every_s": beat}).status_code == 204
    assert status_of(client) == "running"


def test_the_runs_list_sorts_by_the_status_it_shows(client, new_run):
    """A running run whose agent went silent sorts as crashed, not with the running ones."""
    make_run(client, new_run, "alive")
    make_run(client, new_run, "gone")  # newer: with the stored status it would sort first of the two
    assert client.post("/api/v1/runs/gone/heartbeat", json={"every_s": 0.05}).status_code == 204
    make_run(client, new_run, "done")
    assert client.patch("/api/v1/runs/done", json={"status": "finished"}).status_code == 200
    wait_for(lambda: status_of(client, "gone") == "crashed", 5, "crashed")
    assert listed(client, sort="status") == ["gone", "done", "alive"]  # crashed, finished, running
    assert listed(client, sort="-status") == ["alive", "done", "gone"]
    assert listed(client, sort="status", limit=1, offset=1) == ["done"]


def test_finished_and_failed_runs_never_go_stale(client, new_run):
    for run_id, final in (("done", "finished"), ("broke", "failed")):
        make_run(client, new_run, run_id)
        assert client.post(f"/api/v1/runs/{run_id}/heartbeat", json={"every_s": 0.05}).status_code == 204
        assert client.patch(f"/api/v1/runs/{run_id}", json={"status": final}).status_code == 200
    time.sleep(0.6)  # ten beats
    assert status_of(client, "done") == "finished" and status_of(client, "broke") == "failed"


def test_a_run_of_an_agent_without_heartbeats_is_judged_by_the_default_period(client, new_run):
    make_run(client, new_run)
    run = client.get("/api/v1/runs/run-1").json()
    assert run["heartbeat_s"] is None and run["status"] == "running"
    stored = liveness.DEFAULT_HEARTBEAT_S
    assert liveness.STALE_BEATS * stored >= 60  # a record every interval of a minute keeps it running


def test_heartbeats_and_refusals_name_what_is_wrong(client, new_run):
    assert client.post("/api/v1/runs/nope/heartbeat", json={}).status_code == 404
    make_run(client, new_run)
    for bad in ({"every_s": 0}, {"every_s": -1}, {"every_s": "soon"}):
        response = client.post("/api/v1/runs/run-1/heartbeat", json=bad)
        assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "every_s"], bad
    refusal = {"interval": 0, "first_step": 1, "last_step": 10, "by": "agent", "reason": "x"}
    assert client.post("/api/v1/runs/nope/refusals", json={"refusals": [refusal]}).status_code == 404
    response = client.post("/api/v1/runs/run-1/refusals", json={"refusals": [{**refusal, "by": "someone"}]})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"][-1] == "by"
    assert client.post("/api/v1/runs/run-1/refusals", json={"refusals": []}).status_code == 422


@pytest.mark.parametrize("field", ["interval", "rank", "first_step", "last_step"])
@pytest.mark.parametrize("value", [False, True, "3"])
def test_refusals_and_heartbeats_take_numbers_only(make_client, database_url, new_run, field, value):
    """true, false and "3" are no integers (JSON Schema's "integer" is a number): 422 naming the
    field, and nothing counted in the run's refused summary."""
    client = make_client(database_url)
    make_run(client, new_run)
    refusal = {"interval": 4, "first_step": 41, "last_step": 50, "by": "agent", "reason": "x", field: value}
    response = client.post("/api/v1/runs/run-1/refusals", json={"refusals": [refusal]})
    assert response.status_code == 422, response.text
    assert response.json()["detail"][0]["loc"] == ["body", "refusals", 0, field]
    assert client.get("/api/v1/runs/run-1").json()["refused"] is None
    response = client.post("/api/v1/runs/run-1/heartbeat", json={"every_s": value})
    assert response.status_code == 422 and response.json()["detail"][0]["loc"] == ["body", "every_s"]
    whole = {**refusal, field: 4.0 if field != "last_step" else 50.0}  # a JSON number written 4.0 is 4
    assert client.post("/api/v1/runs/run-1/refusals", json={"refusals": [whole]}).status_code == 204


def test_refused_intervals_are_counted_once_with_their_reasons(make_client, database_url, new_run, records):
    client = make_client(database_url)
    make_run(client, new_run)
    bad = "cu_seqlens decreases at 2 entries"
    body = {
        "refusals": [
            {"interval": k, "rank": 0, "first_step": 10 * k + 1, "last_step": 10 * k + 10, "by": "agent", "reason": bad}
            for k in range(3)
        ]
        + [{"interval": 3, "rank": 1, "first_step": 31, "last_step": 40, "by": "server", "reason": "HTTP 422: no"}]
    }
    assert client.post("/api/v1/runs/run-1/refusals", json=body).status_code == 204
    assert client.post("/api/v1/runs/run-1/refusals", json=body).status_code == 204  # a resend: stored once
    run = client.get("/api/v1/runs/run-1").json()
    assert run["records"] == 0 and run["status"] == "running"
    assert run["refused"] == {
        "intervals": 4,
        "first_step": 1,
        "last_step": 40,
        "reasons": [
            {"by": "agent", "reason": bad, "intervals": 3},
            {"by": "server", "reason": "HTTP 422: no", "intervals": 1},
        ],
    }
    (listed_run,) = client.get("/api/v1/runs").json()["runs"]
    assert listed_run["refused"]["intervals"] == 4
    make_run(client, new_run, "clean")
    assert client.get("/api/v1/runs/clean").json()["refused"] is None


def test_the_layout_seen_in_the_batches_replaces_the_declared_one(make_client, database_url, new_run):
    client = make_client(database_url)
    make_run(client, new_run, "hf", layout="thd")
    make_run(client, new_run, "packed", layout="thd")
    patch = {"layout": "bshd"}
    assert client.patch("/api/v1/runs/hf", json=patch).status_code == 200
    run = client.get("/api/v1/runs/hf").json()
    assert (run["layout"], run["layout_declared"], run["status"]) == ("bshd", "thd", "running")
    assert listed(client, layout="bshd") == ["hf"]
    assert listed(client, layout="thd") == ["packed"]
    assert sorted(listed(client, sort="layout")) == ["hf", "packed"] and listed(client, sort="layout")[0] == "hf"

    trl = {"layout": "thd", "pack_length": 1024, "pack_length_from": "TRL max_length"}
    assert client.patch("/api/v1/runs/packed", json=trl).status_code == 200
    run = client.get("/api/v1/runs/packed").json()
    assert (run["layout"], run["pack_length"], run["pack_length_from"]) == ("thd", 1024, "TRL max_length")
    for value in ("thd-static", "mixed"):
        assert client.patch("/api/v1/runs/packed", json={"layout": value}).status_code == 200
        assert listed(client, layout=value) == ["packed"]
    assert client.get("/api/v1/runs/packed").json()["pack_length"] == 1024  # a layout alone keeps it
    for bad in ({"layout": "sbhd"}, {"layout": None}, {"pack_length": 0}, {"pack_length": "1024"}):
        assert client.patch("/api/v1/runs/packed", json=bad).status_code == 422, bad
    # A resume re-registers with the declared layout: what the batches were stays.
    assert client.post("/api/v1/runs", json=new_run("hf", layout="thd")).status_code == 200
    assert client.get("/api/v1/runs/hf").json()["layout"] == "bshd"


def test_the_cross_document_check_is_kept_and_shown_with_the_run(make_client, database_url, new_run):
    client = make_client(database_url)
    make_run(client, new_run, "oss", layout="thd")
    assert client.get("/api/v1/runs/oss").json()["cross_documents"] is None  # no check reported
    detail = "GptOssForCausalLM with position_ids batches: packed documents attend to each other"
    patch = {"cross_documents": "crossed", "cross_documents_detail": detail}
    assert client.patch("/api/v1/runs/oss", json=patch).status_code == 200
    for run in (client.get("/api/v1/runs/oss").json(), client.get("/api/v1/runs").json()["runs"][0]):
        assert (run["cross_documents"], run["cross_documents_detail"]) == ("crossed", detail)
    # Another PATCH (the layout) leaves it; a later verdict replaces it with its own sentence.
    assert client.patch("/api/v1/runs/oss", json={"layout": "thd"}).status_code == 200
    assert client.get("/api/v1/runs/oss").json()["cross_documents"] == "crossed"
    assert client.patch("/api/v1/runs/oss", json={"cross_documents": "not checked"}).status_code == 200
    run = client.get("/api/v1/runs/oss").json()
    assert (run["cross_documents"], run["cross_documents_detail"]) == ("not checked", None)
    for bad in (
        {"cross_documents": "maybe"},
        {"cross_documents": None},
        {"cross_documents": "kept", "cross_documents_detail": "x" * 301},
    ):
        assert client.patch("/api/v1/runs/oss", json=bad).status_code == 422, bad


def test_sync_sites_cover_the_window_of_the_steady_rates(client, run, records):
    recs = records(4)
    assert client.post("/api/v1/runs/run-1/intervals", json={"intervals": recs}).status_code == 200
    summary = client.get("/api/v1/runs/run-1").json()
    steady = client.get("/api/v1/runs/run-1/sync-sites", params={"window": "steady"}).json()
    whole = client.get("/api/v1/runs/run-1/sync-sites").json()
    later = recs[1:]
    steps = sum(r["steps"] - r["syncs"].get("uncounted_steps", 0) for r in later)  # the counted ones
    assert (steady["window"], steady["first_step"], steady["last_step"]) == ("steady", 11, 40)
    assert (whole["window"], whole["first_step"], whole["last_step"]) == ("run", 1, 40)
    assert (summary["first_step"], summary["steady_first_step"], summary["last_step"]) == (1, 11, 40)
    # The table's per-iteration total is the tile's number, over the same steps.
    assert steady["syncs_per_iter"] == pytest.approx(summary["steady"]["syncs_per_iter"], rel=1e-12)
    assert steady["syncs_per_iter"] == pytest.approx(sum(r["syncs"]["total"] for r in later) / steps)
    for site in steady["sites"]:
        want = sum(s["count"] for r in later for s in r["syncs"]["sites"] if s["site"] == site["site"])
        assert site["count"] == want and site["per_iter"] == pytest.approx(want / steps)
    assert whole["syncs_per_iter"] == pytest.approx(summary["totals"]["syncs_per_iter"], rel=1e-12)


def test_a_run_of_one_interval_has_one_window(client, run, records):
    assert client.post("/api/v1/runs/run-1/intervals", json={"intervals": records(1)}).status_code == 200
    summary = client.get("/api/v1/runs/run-1").json()
    assert summary["steady"] is None and summary["steady_first_step"] is None
    steady = client.get("/api/v1/runs/run-1/sync-sites", params={"window": "steady"}).json()
    assert (steady["window"], steady["first_step"], steady["last_step"]) == ("run", 1, 10)


def test_migration_0012_keeps_every_row_both_ways(make_client, database_url, new_run, records):
    """0012 adds nullable columns in place and a table: a populated database keeps its runs and
    intervals on the way up and on the way down (under the foreign keys that cascade)."""
    import sqlalchemy as sa

    from packscope.backend.store.db import make_engine, upgrade_schema

    client = make_client(database_url)
    make_run(client, new_run)
    assert client.post("/api/v1/runs/run-1/intervals", json={"intervals": records(5)}).json()["accepted"] == 5
    assert client.post("/api/v1/runs/run-1/heartbeat", json={"every_s": 5}).status_code == 204
    engine = make_engine(database_url)

    def counted() -> tuple[int, int, int]:
        with engine.connect() as connection:
            return tuple(
                connection.execute(sa.text(f"SELECT count(*) FROM {table}")).scalar_one()
                for table in ("runs", "intervals", "run_totals")
            )

    try:
        assert counted() == (1, 5, 1)
        downgrade(engine, "0011")
        assert counted() == (1, 5, 1)
        with engine.connect() as connection:
            columns = {c["name"] for c in sa.inspect(connection).get_columns("runs")}
            assert not {"last_contact_at", "heartbeat_s", "layout_seen", "pack_length"} & columns
            assert "refused_intervals" not in sa.inspect(connection).get_table_names()
        upgrade_schema(engine)
        assert counted() == (1, 5, 1)
    finally:
        engine.dispose()
    run = make_client(database_url).get("/api/v1/runs/run-1").json()
    assert (run["records"], run["heartbeat_s"], run["layout"], run["refused"]) == (5, None, "thd", None)
