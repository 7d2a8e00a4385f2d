"""The runs table's API: sort, filter, search, pagination, edits, archive and delete (docs/api.md)."""

from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.backend.conftest import run_body

RUNS = "/api/v1/runs"


@pytest.fixture
def table(make_client, database_url, records) -> TestClient:
    """Five runs: varied projects, tags, layouts, statuses and throughput (two without intervals)."""
    client = make_client(database_url)
    runs = [
        ("alpha", "Alpha base", "p1", ["base", "h200"], "thd", "2026-11-29T09:00:00Z", 3),
        ("beta", "beta long", "p1", ["long"], "bshd", "2026-11-29T10:00:00Z", 1),
        ("gamma", None, "p2", ["base"], "thd", "2026-11-29T11:00:00Z", 0),
        ("delta", "Délta 100%_x", "p2", ["ünï"], "thd", "2026-11-29T12:00:00Z", 5),
        ("epsilon", "eps", None, [], "bshd", "2026-11-29T13:00:00Z", 0),
    ]
    for i, (run_id, name, project, tags, layout, started, n) in enumerate(runs):
        body = run_body(run_id, name=name, project=project, tags=tags, layout=layout, started_at=started)
        assert client.post(RUNS, json=body).status_code == 201
        if n:
            answer = client.post(f"{RUNS}/{run_id}/intervals", json={"intervals": records(n, seed=i, steps=5 + i)})
            assert answer.status_code == 200, answer.text
    assert client.patch(f"{RUNS}/beta", json={"status": "finished"}).status_code == 200
    return client


def ids(client: TestClient, **params: Any) -> list[str]:
    answer = client.get(RUNS, params=params)
    assert answer.status_code == 200, answer.text
    return [r["run_id"] for r in answer.json()["runs"]]


def test_default_order_total_and_new_fields(table):
    body = table.get(RUNS).json()
    assert [r["run_id"] for r in body["runs"]] == ["epsilon", "delta", "gamma", "beta", "alpha"]
    assert body["total"] == 5
    assert all(r["notes"] == "" and r["archived"] is False for r in body["runs"])


def test_sort_by_columns_and_metrics(table):
    assert ids(table, sort="run_id") == ["alpha", "beta", "delta", "epsilon", "gamma"]
    assert ids(table, sort="-run_id") == ["gamma", "epsilon", "delta", "beta", "alpha"]
    assert ids(table, sort="started_at") == ["alpha", "beta", "gamma", "delta", "epsilon"]
    # Stored amounts (SQL, the whole run) and rates as the table shows them, without each run's
    # first interval once it has a second (Python): runs without intervals last either way.
    for key in ("steps", "records", "tflops_useful", "step_time_s", "padding_pct", "flops_thd"):
        runs = table.get(RUNS, params={"sort": key}).json()["runs"]

        def value(r: dict[str, Any], key: str = key) -> Any:
            if key == "records":
                return r[key]
            return (r["totals"] if key in ("steps", "flops_thd") else r["steady"] or r["totals"])[key]

        assert [r["run_id"] for r in runs[3:]] == ["epsilon", "gamma"], key
        values = [value(r) for r in runs[:3]]
        assert values == sorted(values), key
        down = table.get(RUNS, params={"sort": f"-{key}"}).json()["runs"]
        assert [value(r) for r in down[:3]] == sorted(values, reverse=True), key
        assert [r["run_id"] for r in down[3:]] == ["epsilon", "gamma"], key
    # Pagination over a Python-sorted metric takes the same order.
    full = ids(table, sort="-tflops_useful")
    assert ids(table, sort="-tflops_useful", limit=2) + ids(table, sort="-tflops_useful", offset=2) == full


def test_filters_and_search(table):
    assert ids(table, project="p1") == ["beta", "alpha"]
    assert ids(table, tag="base") == ["gamma", "alpha"]
    assert ids(table, tag="ünï") == ["delta"]
    assert ids(table, tag="bas") == []  # a tag matches whole
    assert ids(table, layout="bshd") == ["epsilon", "beta"]
    assert ids(table, status="finished") == ["beta"]
    assert ids(table, project="p2", layout="thd") == ["delta", "gamma"]
    assert ids(table, q="ALPHA") == ["alpha"]  # the name, any case
    assert ids(table, q="amm") == ["gamma"]  # the run_id
    assert ids(table, q="long") == ["beta"]  # name and tag
    assert ids(table, q="h20") == ["alpha"]  # a tag
    assert ids(table, q="100%_") == ["delta"]  # LIKE wildcards are literal
    assert ids(table, q="%") == ["delta"]
    assert ids(table, q="_") == ["delta"]
    body = table.get(RUNS, params={"project": "p2", "limit": 1}).json()
    assert (len(body["runs"]), body["total"]) == (1, 2)


def test_pagination(table):
    assert ids(table, limit=2) == ["epsilon", "delta"]
    assert ids(table, limit=2, offset=2) == ["gamma", "beta"]
    assert ids(table, limit=2, offset=4) == ["alpha"]
    body = table.get(RUNS, params={"offset": 10}).json()
    assert body == {"runs": [], "total": 5}


@pytest.mark.parametrize(
    "params",
    [
        {"limit": 0},
        {"limit": 1001},
        {"offset": -1},
        {"offset": 2**31},
        {"sort": "nope"},
        {"sort": "--name"},
        {"sort": "tags"},
        {"sort": "config"},
        {"layout": "nhwc"},
        {"status": "done"},
        {"q": "x" * 201},
        {"tag": "x" * 101},
        {"project": "x" * 201},
        {"archived": "maybe"},
    ],
)
def test_out_of_range_is_422(client, params):
    assert client.get(RUNS, params=params).status_code == 422


def test_edit_name_notes_tags(table):
    answer = table.patch(
        f"{RUNS}/gamma", json={"name": "Gamma 2", "notes": "lr sweep\nbest so far", "tags": ["x", "y"]}
    )
    assert answer.status_code == 200, answer.text
    run = answer.json()
    assert (run["name"], run["notes"], run["tags"], run["status"]) == (
        "Gamma 2",
        "lr sweep\nbest so far",
        ["x", "y"],
        "running",
    )
    again = table.get(f"{RUNS}/gamma").json()
    assert (again["name"], again["notes"], again["tags"]) == ("Gamma 2", "lr sweep\nbest so far", ["x", "y"])
    assert ids(table, tag="x") == ["gamma"]
    # Only what is sent changes; null clears.
    assert table.patch(f"{RUNS}/gamma", json={"notes": None}).json()["notes"] == ""
    cleared = table.patch(f"{RUNS}/gamma", json={"name": None, "tags": None}).json()
    assert (cleared["name"], cleared["tags"], cleared["notes"]) == (None, [], "")
    # The agent's status patch still works, alone and with edits.
    done = table.patch(f"{RUNS}/gamma", json={"status": "failed", "name": "g"}).json()
    assert (done["status"], done["name"]) == ("failed", "g") and done["ended_at"] is not None


@pytest.mark.parametrize(
    "body",
    [
        {},
        {"notes": "x" * 10_001},
        {"tags": ["x"] * 51},
        {"tags": ["x" * 101]},
        {"name": "x" * 201},
        {"name": "nul\u0000"},
        {"archived": "yes"},
        {"archived": None},
        {"status": None},
        {"ended_at": "2026-11-29T09:30:00Z"},
    ],
)
def test_bad_edits_are_422(client, run, body):
    assert client.patch(f"{RUNS}/run-1", json=body).status_code == 422


def test_edits_at_the_limits(client, run):
    body = {"notes": "n" * 10_000, "tags": [f"{i:03d}" + "t" * 97 for i in range(50)]}
    answer = client.patch(f"{RUNS}/run-1", json=body)
    assert answer.status_code == 200
    assert (len(answer.json()["notes"]), len(answer.json()["tags"])) == (10_000, 50)


def test_archive_hides_from_the_default_list(table):
    assert table.patch(f"{RUNS}/beta", json={"archived": True}).json()["archived"] is True
    assert "beta" not in ids(table)
    assert table.get(RUNS).json()["total"] == 4
    assert ids(table, archived="true") == ["epsilon", "delta", "gamma", "beta", "alpha"]
    assert ids(table, project="p1") == ["alpha"]
    assert table.get(f"{RUNS}/beta").status_code == 200  # still readable by id
    table.patch(f"{RUNS}/beta", json={"archived": False})
    assert "beta" in ids(table)


def test_delete_removes_the_run_and_its_data(table):
    assert table.get(f"{RUNS}/alpha/series").json()["points"] == 3
    answer = table.delete(f"{RUNS}/alpha")
    assert answer.status_code == 204
    assert table.get(f"{RUNS}/alpha").status_code == 404
    assert "alpha" not in ids(table, archived="true")
    assert table.delete(f"{RUNS}/alpha").status_code == 404
    assert table.patch(f"{RUNS}/alpha", json={"name": "x"}).status_code == 410  # a deleted run (test_fragile.py)
    # The run's rows are gone with it (cascade): re-created on purpose, it starts empty.
    assert table.post(RUNS, json=run_body("alpha")).status_code == 410
    assert table.post(RUNS, params={"recreate": "true"}, json=run_body("alpha")).status_code == 201
    again = table.get(f"{RUNS}/alpha").json()
    assert (again["records"], again["totals"]) == (0, None)
    assert table.get(f"{RUNS}/alpha/series").json()["points"] == 0


def test_cascade_leaves_no_rows(make_client, database_url, records):
    from sqlalchemy import func, select

    from packscope.backend.store.models import interval_details, intervals, rollups, run_sync_sites, run_totals

    client = make_client(database_url)
    client.post(RUNS, json=run_body("a"))
    client.post(RUNS, json=run_body("b"))
    for run_id in ("a", "b"):
        client.post(f"{RUNS}/{run_id}/intervals", json={"intervals": records(4)})
    assert client.delete(f"{RUNS}/a").status_code == 204
    with client.app.state.sessionmaker() as session:
        for table in (intervals, interval_details, rollups, run_sync_sites, run_totals):
            total = session.scalar(select(func.count()).select_from(table))
            assert total and total > 0, table.name  # b's rows stay
        left = session.scalar(select(func.count()).select_from(intervals))
    assert left == 4


def test_edits_and_delete_need_the_ingest_token(make_client):
    client = make_client(ingest_token="secret")
    auth = {"Authorization": "Bearer secret"}
    assert client.post(RUNS, json=run_body("r"), headers=auth).status_code == 201
    assert client.patch(f"{RUNS}/r", json={"name": "x"}).status_code == 401
    assert client.delete(f"{RUNS}/r").status_code == 401
    assert client.delete(f"{RUNS}/r", headers={"Authorization": "Bearer wrong"}).status_code == 401
    assert client.patch(f"{RUNS}/r", json={"name": "x"}, headers=auth).json()["name"] == "x"
    assert client.delete(f"{RUNS}/r", headers=auth).status_code == 204


def test_facets_count_runs_per_project_and_tag(table):
    facets = table.get("/api/v1/facets").json()
    assert facets == {
        "projects": [{"value": "p1", "runs": 2}, {"value": "p2", "runs": 2}],
        "tags": [
            {"value": "base", "runs": 2},
            {"value": "h200", "runs": 1},
            {"value": "long", "runs": 1},
            {"value": "ünï", "runs": 1},
        ],
    }
    # Each count is what the matching filter finds.
    for facet in facets["projects"]:
        assert table.get(RUNS, params={"project": facet["value"]}).json()["total"] == facet["runs"]
    for facet in facets["tags"]:
        assert table.get(RUNS, params={"tag": facet["value"]}).json()["total"] == facet["runs"]
    assert table.patch(f"{RUNS}/alpha", json={"archived": True, "tags": ["base", "base"]}).status_code == 200
    shown = table.get("/api/v1/facets").json()
    assert {"value": "p1", "runs": 1} in shown["projects"] and {"value": "base", "runs": 1} in shown["tags"]
    assert all(f["value"] != "h200" for f in shown["tags"])
    every = table.get("/api/v1/facets", params={"archived": "true"}).json()
    assert {"value": "p1", "runs": 2} in every["projects"] and {"value": "base", "runs": 2} in every["tags"]
