"""The runs list carries what the table shows: no configs (the run's own endpoint has its config),
only the config values asked for with `config_keys`."""

import pytest

from tests.backend.conftest import run_body

RUNS = "/api/v1/runs"
BIG_CONFIG = {"notes": "x" * 200_000, "lr": 3e-4, "optimizer": {"name": "adamw", "betas": [0.9, 0.95]}}


def test_the_runs_list_carries_no_configs(make_client, database_url):
    # The issue: 100 runs with 250 KB configs made GET /api/v1/runs 25 MB, polled every 5 s.
    client = make_client(database_url)
    for i in range(5):
        assert client.post(RUNS, json=run_body(f"run-{i}", config=BIG_CONFIG)).status_code == 201
    answer = client.get(RUNS)
    assert answer.status_code == 200
    assert len(answer.content) < 30_000, len(answer.content)
    assert all("config" not in run and run["config_values"] == {} for run in answer.json()["runs"])
    assert client.get(f"{RUNS}/run-0").json()["config"] == BIG_CONFIG  # the run's own endpoint has it


def test_config_keys_pick_values_from_each_runs_config(make_client, database_url):
    client = make_client(database_url)
    client.post(RUNS, json=run_body("a", config=BIG_CONFIG))
    client.post(RUNS, json=run_body("b", config={"lr": 1e-3, "optimizer": "sgd"}))
    client.post(RUNS, json=run_body("c", config={}))
    answer = client.get(RUNS, params={"config_keys": "lr,optimizer.name,optimizer.betas,lr", "sort": "run_id"})
    assert answer.status_code == 200, answer.text
    values = {run["run_id"]: run["config_values"] for run in answer.json()["runs"]}
    assert values == {
        "a": {"lr": 3e-4, "optimizer.name": "adamw", "optimizer.betas": [0.9, 0.95]},
        "b": {"lr": 1e-3, "optimizer.name": None, "optimizer.betas": None},  # "sgd" has no keys
        "c": {"lr": None, "optimizer.name": None, "optimizer.betas": None},
    }
    assert len(answer.content) < 20_000


@pytest.mark.parametrize("keys", ["", "lr,", "a..b", 'x"y', "lr;drop", ",".join(f"k{i}" for i in range(21))])
def test_config_keys_that_name_no_object_key_are_422(client, keys):
    answer = client.get(RUNS, params={"config_keys": keys})
    assert answer.status_code == 422, (keys, answer.text)
    assert answer.json()["detail"][0]["loc"] == ["query", "config_keys"]
