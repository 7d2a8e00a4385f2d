"""GET /api/v1/runs/{run_id}/ranks: a 3-rank run posted directly, checked against hand computation."""

import pytest

RUNS = "/api/v1/runs"
RUN = f"{RUNS}/run-1"
STEPS = 10  # steps per interval (make_record's default)

# Seconds per step, [interval][rank]: interval 1 has a straggler (rank 2), interval 3 a tie.
STEP_S = [
    [0.10, 0.11, 0.12],
    [0.10, 0.10, 0.30],
    [0.20, 0.10, 0.15],
    [0.25, 0.25, 0.05],
]


@pytest.fixture
def three_ranks(client, new_run, records):
    assert client.post(RUNS, json=new_run(parallel={"dp": 3})).status_code == 201
    batch = []
    for rank in range(3):
        for i, rec in enumerate(records(len(STEP_S), seed=rank, gpus=1, rank=rank)):
            rec["gpu_time_s"] = STEP_S[i][rank] * STEPS
            batch.append(rec)
    assert client.post(f"{RUN}/intervals", json={"intervals": batch}).json()["accepted"] == 3 * len(STEP_S)
    return client


def test_each_rank_and_the_straggler_of_each_interval(three_ranks):
    got = three_ranks.get(f"{RUN}/ranks").json()
    assert got["ranks"] == [0, 1, 2]
    assert got["interval"] == [0, 1, 2, 3]
    assert got["step"] == [10, 20, 30, 40]
    for rank in range(3):
        assert got["step_time_s"][rank] == pytest.approx([row[rank] for row in STEP_S])
    assert got["slowest_rank"] == [2, 2, 0, 0]  # interval 3: ranks 0 and 1 tie, the lower one is named
    assert got["slowest_s"] == pytest.approx([0.12, 0.30, 0.20, 0.25])
    assert got["median_s"] == pytest.approx([0.11, 0.10, 0.15, 0.25])
    assert got["spread"] == pytest.approx([0.12 / 0.11, 3.0, 0.20 / 0.15, 1.0])
    assert got["reporting_ranks"] == [3, 3, 3, 3]


def test_a_rank_that_has_not_sent_yet_is_null(three_ranks, records):
    late = records(1, start=len(STEP_S), seed=9, gpus=1, rank=1)
    late[0]["gpu_time_s"] = 0.4 * STEPS
    assert three_ranks.post(f"{RUN}/intervals", json={"intervals": late}).json()["accepted"] == 1
    got = three_ranks.get(f"{RUN}/ranks").json()
    assert got["interval"][-1] == 4 and got["reporting_ranks"][-1] == 1
    assert [row[-1] for row in got["step_time_s"]] == [None, pytest.approx(0.4), None]
    assert got["slowest_rank"][-1] == 1 and got["spread"][-1] == pytest.approx(1.0)


def test_intervals_are_strided_evenly_within_the_step_range(client, new_run, records):
    assert client.post(RUNS, json=new_run()).status_code == 201
    recs = [r for rank in range(2) for r in records(10, seed=rank, gpus=1, rank=rank)]
    assert client.post(f"{RUN}/intervals", json={"intervals": recs}).json()["accepted"] == 20
    assert client.get(f"{RUN}/ranks", params={"max_points": 4}).json()["interval"] == [0, 3, 6, 9]
    assert client.get(f"{RUN}/ranks", params={"max_points": 1}).json()["interval"] == [9]  # the latest
    ranged = client.get(f"{RUN}/ranks", params={"step_min": 25, "step_max": 55}).json()
    assert ranged["interval"] == [2, 3, 4, 5]  # steps 21-30 .. 51-60 meet [25, 55]
    empty = client.get(f"{RUN}/ranks", params={"step_min": 500}).json()
    assert empty["interval"] == [] and empty["ranks"] == [] and empty["step_time_s"] == []


@pytest.mark.parametrize(
    "query",
    [
        {"max_points": 0},
        {"max_points": 1001},
        {"step_min": -1},
        {"step_max": -1},
        {"step_min": 2**63},
        {"max_points": "many"},
    ],
)
def test_parameters_out_of_range_are_422(three_ranks, query):
    assert three_ranks.get(f"{RUN}/ranks", params=query).status_code == 422


def test_unknown_run_is_404(client):
    answer = client.get(f"{RUNS}/nope/ranks")
    assert answer.status_code == 404 and "nope" in answer.json()["detail"]


def test_reads_need_the_read_token_when_one_is_set(make_client, new_run):
    client = make_client(read_token="r3ad", ingest_token="1ngest")
    headers = {"Authorization": "Bearer 1ngest"}
    assert client.post(RUNS, json=new_run(), headers=headers).status_code == 201
    assert client.get(f"{RUN}/ranks").status_code == 401
    assert client.get(f"{RUN}/ranks", headers={"Authorization": "Bearer r3ad"}).status_code == 200


def test_a_ranks_step_time_is_the_catalogues_over_its_row(client, new_run, records):
    """The per-rank step time is the catalogue's step_time_s of that rank's row, to the last bit:
    its GPU time over its steps, whatever the steps (here not 10)."""
    assert client.post(RUNS, json=new_run(parallel={"dp": 2})).status_code == 201
    batch = [rec for rank in range(2) for rec in records(3, seed=5 + rank, steps=7 + rank, gpus=1, rank=rank)]
    assert client.post(f"{RUN}/intervals", json={"intervals": batch}).json()["accepted"] == 6
    got = client.get(f"{RUN}/ranks").json()["step_time_s"]
    assert got == [[r["gpu_time_s"] / r["steps"] for r in batch if r["rank"] == rank] for rank in range(2)]
