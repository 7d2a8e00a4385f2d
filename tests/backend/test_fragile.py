"""Writes that used to be taken silently or wrongly: to a deleted run (410 Gone until it is created
again on purpose), to a finished or failed run (stored; its status stays), and run bodies too
large to be a run (413 before they are parsed)."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from packscope.backend.http.settings import Settings
from tests.backend.conftest import run_body
from tests.backend.uvicorn_server import serving

RUNS = "/api/v1/runs"
RUN = f"{RUNS}/run-1"
BATCH = f"{RUN}/intervals"


def test_an_agent_still_sending_to_a_deleted_run_is_answered_410(make_client, database_url, records):
    # The issue: deleting a run that was still training was undone by the agent, with only the
    # later rows (it re-registered the run and sent on).
    client = make_client(database_url)
    assert client.post(RUNS, json=run_body()).status_code == 201
    assert client.post(BATCH, json={"intervals": records(3)}).status_code == 200
    assert client.delete(RUN).status_code == 204
    later = client.post(BATCH, json={"intervals": records(2, start=3)})
    assert later.status_code == 410 and "recreate=true" in later.json()["detail"]
    again = client.post(RUNS, json=run_body())  # what an agent does when its run is missing
    assert again.status_code == 410
    assert client.patch(RUN, json={"status": "finished"}).status_code == 410
    assert client.get(RUNS).json()["total"] == 0
    assert client.get(RUN).status_code == 404  # reads: simply not stored
    assert client.delete(RUN).status_code == 404


def test_a_deleted_run_id_can_be_created_again_on_purpose(make_client, database_url, records):
    client = make_client(database_url)
    client.post(RUNS, json=run_body())
    client.post(BATCH, json={"intervals": records(3)})
    client.delete(RUN)
    created = client.post(RUNS, params={"recreate": "true"}, json=run_body())
    assert created.status_code == 201 and created.json()["records"] == 0  # the old rows stay gone
    assert client.post(BATCH, json={"intervals": records(2, start=3)}).json() == {"accepted": 2, "duplicates": 0}
    assert client.post(RUNS, json=run_body()).status_code == 200  # an ordinary resume again
    assert client.delete(RUN).status_code == 204
    assert client.post(RUNS, json=run_body()).status_code == 410  # deleted a second time


@pytest.mark.parametrize("status", ["finished", "failed"])
def test_records_that_land_after_the_run_ended_are_stored_and_its_status_stays(
    make_client, database_url, records, status
):
    # Records that land after the mark were made before it: rank 1's last interval after rank 0
    # said "finished", a batch in flight when SIGTERM marked the run failed, a spool synced later.
    # Stored (nothing lost); the status stays, as would the run's page, instead of running, then
    # stale and crashed once no heartbeat follows (what reviving the run on records did).
    client = make_client(database_url)
    client.post(RUNS, json=run_body())
    client.post(BATCH, json={"intervals": records(2, rank=0) + records(1, rank=1)})
    ended = client.patch(RUN, json={"status": status}).json()
    assert ended["status"] == status and ended["ended_at"] is not None
    assert client.post(BATCH, json={"intervals": records(1, start=1, rank=1)}).json()["accepted"] == 1
    run = client.get(RUN).json()
    assert run["status"] == status and run["ended_at"] == ended["ended_at"] and run["records"] == 4
    listed = client.get(RUNS, params={"status": status}).json()
    assert [r["run_id"] for r in listed["runs"]] == ["run-1"]
    # A trainer that goes on after all says so itself.
    assert client.patch(RUN, json={"status": "running"}).json()["status"] == "running"


def test_a_run_body_larger_than_any_run_is_refused_before_it_is_parsed(make_client):
    client = make_client(max_run_body_bytes=64 * 1024)
    # Not JSON at all: a 413 (not a 422) shows it was never parsed.
    answer = client.post(RUNS, content=b"{" * (100 * 1024), headers={"content-type": "application/json"})
    assert answer.status_code == 413 and "PACKSCOPE_MAX_RUN_BODY_BYTES" in answer.json()["detail"]
    big = run_body(config={"x": "y" * 80_000})
    assert client.post(RUNS, json=big).status_code == 413
    assert client.post(RUNS, json=run_body(config={"x": "y" * 30_000})).status_code == 201


def test_ten_8_mb_run_bodies_at_once_are_all_413_and_the_server_keeps_answering(sqlite_url):
    # The issue: an 8 MB config was parsed before it was refused; ten in parallel gave five 503s.
    settings = Settings(database_url=sqlite_url, ingest_token=None, read_token=None)
    body = httpx.Request("POST", "http://x", json=run_body(config={"x": "y" * 8_000_000})).content
    with serving(settings) as url:

        def post(_: int) -> int:
            headers = {"content-type": "application/json"}
            return httpx.post(f"{url}{RUNS}", content=body, headers=headers, timeout=60).status_code

        with ThreadPoolExecutor(10) as pool:
            codes = list(pool.map(post, range(10)))
        assert codes == [413] * 10
        assert httpx.get(f"{url}{RUNS}").status_code == 200
