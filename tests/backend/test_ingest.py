"""The write side of the wire contract: validation, idempotency, gzip, limits, tokens."""

import csv
import gzip
import io
import json

import pytest

from packscope.core.catalogue import FIELDS

RUNS = "/api/v1/runs"
RUN = "/api/v1/runs/run-1"
BATCH = f"{RUN}/intervals"


def stored_intervals(client) -> int:
    return client.get(RUN).json()["records"]


def post_gzip(client, url, body, **headers):
    data = gzip.compress(json.dumps(body).encode())
    headers = {"Content-Type": "application/json", "Content-Encoding": "gzip", **headers}
    return client.post(url, content=data, headers=headers)


def test_round_trip(database_url, make_client, new_run, records, oracle, close):
    client = make_client(database_url)
    assert client.post(RUNS, json=new_run()).status_code == 201
    recs = records(30, seed=1)
    recs[0]["gpu"] = {"util_pct": 97.0, "power_w": 650.0, "energy_j": 975.0}
    assert client.post(BATCH, json={"intervals": recs[:10]}).json() == {"accepted": 10, "duplicates": 0}
    assert post_gzip(client, BATCH, {"intervals": recs[10:]}).json() == {"accepted": 20, "duplicates": 0}

    run = client.get(RUN).json()
    assert (run["records"], run["last_step"], run["status"]) == (30, 300, "running")
    close(run["totals"], oracle(recs), [k for k in run["totals"] if k in oracle(recs)])

    series = client.get(f"{RUN}/series", params={"max_points": 500}).json()
    assert series["points"] == 30  # fewer intervals than points: one bucket each
    for i, rec in enumerate(recs):
        want = oracle([rec])
        got = {name: values[i] for name, values in series["columns"].items()}
        assert (got["first_step"], got["last_step"]) == (rec["first_step"], rec["last_step"])
        assert got["step"] == rec["last_step"]
        close(got, want, ["tflops_thd", "tflops_bshd_min", "tflops_useful_max", "step_time_s", "loss", "padding_pct"])

    hist = client.get(f"{RUN}/histograms", params={"interval": 7}).json()
    assert hist["documents"] == recs[7]["histograms"]["documents"]
    assert hist["packs"] == recs[7]["histograms"]["packs"]
    assert (hist["first_step"], hist["last_step"]) == (71, 80)

    sites = client.get(f"{RUN}/sync-sites").json()["sites"]
    want_88 = sum(s["count"] for r in recs for s in r["syncs"]["sites"] if s["site"] == "train.py:88")
    assert {s["site"]: s["count"] for s in sites}["train.py:88"] == want_88

    rows = list(csv.DictReader(io.StringIO(client.get(f"{RUN}/intervals.csv").text)))
    assert [int(r["interval"]) for r in rows] == list(range(30))
    assert [int(r["seqlen_sq_sum_thd"]) for r in rows] == [r["seqlen_sq_sum_thd"] for r in recs]
    # Floats are written in their shortest exact form, which PostgreSQL spells 650 and Python 650.0.
    assert (float(rows[0]["gpu_power_w"]), float(rows[0]["gpu_energy_j"]), rows[0]["gpu_sm_clock_mhz"]) == (
        650.0,
        975.0,
        "",
    )


def test_replay_counts_duplicates_and_leaves_stored_rows_untouched(client, run, records):
    recs = records(10)
    assert client.post(BATCH, json={"intervals": recs[:6]}).json() == {"accepted": 6, "duplicates": 0}
    changed = [dict(r, loss=99.0, tokens=r["tokens"] + 1) for r in recs]
    # intervals 0-5 replayed with other numbers, 6-9 new, and interval 9 twice in one batch
    body = {"intervals": [*changed, changed[9]]}
    assert client.post(BATCH, json=body).json() == {"accepted": 4, "duplicates": 7}

    rows = list(csv.DictReader(io.StringIO(client.get(f"{RUN}/intervals.csv").text)))
    assert len(rows) == 10
    for row, original in zip(rows[:6], recs[:6], strict=True):
        assert float(row["loss"]) == original["loss"]
        assert int(row["tokens"]) == original["tokens"]
    assert [float(r["loss"]) for r in rows[6:]] == [99.0] * 4
    sites = client.get(f"{RUN}/sync-sites").json()["sites"]
    assert sum(s["count"] for s in sites) == sum(r["syncs"]["total"] for r in recs)


def test_gzip_body_accepted_and_broken_gzip_refused(client, run, records):
    assert post_gzip(client, BATCH, {"intervals": records(3)}).json() == {"accepted": 3, "duplicates": 0}
    broken = client.post(
        BATCH, content=b"not gzip at all", headers={"Content-Encoding": "gzip", "Content-Type": "application/json"}
    )
    assert broken.status_code == 400
    assert "does not decompress" in broken.json()["detail"]
    truncated = gzip.compress(json.dumps({"intervals": records(3, start=3)}).encode())[:-20]
    headers = {"Content-Encoding": "gzip", "Content-Type": "application/json"}
    response = client.post(BATCH, content=truncated, headers=headers)
    assert response.status_code == 400
    assert stored_intervals(client) == 3


def test_body_over_limit_is_413_after_decompression(make_client, new_run, records):
    client = make_client(max_body_bytes=20_000)
    assert client.post(RUNS, json=new_run()).status_code == 201
    body = {"intervals": records(40)}
    raw = json.dumps(body).encode()
    assert len(gzip.compress(raw)) < 20_000 < len(raw)  # small on the wire, large unpacked

    response = post_gzip(client, BATCH, body)
    assert response.status_code == 413
    assert "20000 bytes" in response.json()["detail"] and "PACKSCOPE_MAX_BODY_BYTES" in response.json()["detail"]
    plain = client.post(BATCH, content=raw, headers={"Content-Type": "application/json"})
    assert plain.status_code == 413
    assert stored_intervals(client) == 0
    assert client.post(BATCH, json={"intervals": records(2)}).json()["accepted"] == 2


def test_invalid_record_in_the_middle_stores_nothing(client, run, records):
    recs = records(10)
    recs[4]["first_step"] = recs[4]["last_step"] + 1  # record 5 of 10
    response = client.post(BATCH, json={"intervals": recs})
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["loc"][:3] == ["body", "intervals", 4]
    assert "first_step" in error["msg"] and "after last_step" in error["msg"]
    assert stored_intervals(client) == 0
    assert client.get(f"{RUN}/intervals.csv").text.count("\n") == 1  # the header only


@pytest.mark.parametrize(
    ("mutate", "loc", "words"),
    [
        (lambda r: r["histograms"]["documents"].update(count=[0] * 23), ["histograms", "documents"], "length >= 24"),
        (lambda r: r["histograms"]["packs"].update(tokens=[0] * 25), ["histograms", "packs"], "length <= 24"),
        (lambda r: r.update(steps=0), ["steps"], "Expected `int` >= 1"),
        (lambda r: r.update(tokens=-5), ["tokens"], "Expected `int` >= 0"),
        (lambda r: r.update(real_tokens=r["tokens"] + 1), [], "padding included"),
        (lambda r: r.update(steps=11), [], "more than the 10 steps"),
        (lambda r: r.update(gpu_time_s=float("inf")), ["gpu_time_s"], "<= 1e+300"),
        (lambda r: r["syncs"]["sites"].append(dict(r["syncs"]["sites"][0])), ["syncs", "sites"], "listed twice"),
        (lambda r: r.pop("tokens"), ["tokens"], "Field required"),
    ],
)
def test_invalid_record_is_422_with_a_message(client, run, records, mutate, loc, words):
    recs = records(2)
    mutate(recs[1])
    response = client.post(BATCH, content=json.dumps({"intervals": recs}), headers={"Content-Type": "application/json"})
    assert response.status_code == 422
    (error,) = response.json()["detail"]
    assert error["loc"][:3] == ["body", "intervals", 1]
    assert error["loc"][3 : 3 + len(loc)] == loc
    assert words in error["msg"]
    assert stored_intervals(client) == 0


@pytest.mark.parametrize(
    "deep",
    [
        "[" * 1000 + "]" * 1000,
        '{"a": ' * 1000 + "1" + "}" * 1000,
        "[" * 1000 + "NaN" + "]" * 1000,  # NaN: the body is read by Python's json instead
    ],
)
def test_an_unknown_field_nested_too_deeply_is_422_naming_the_depth(client, run, records, deep):
    text = json.dumps({"intervals": records(1)})
    body = text[: -len("}]}")] + f', "from_a_newer_agent": {deep}}}]}}'
    response = client.post(BATCH, content=body, headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"] == ["body"] and "nests JSON too deeply" in error["msg"]
    assert stored_intervals(client) == 0


def test_batch_size_limits(client, run, records):
    assert client.post(BATCH, json={"intervals": []}).status_code == 422
    one_too_many = client.post(BATCH, json={"intervals": records(1001)})
    assert one_too_many.status_code == 422
    assert "length <= 1000" in one_too_many.json()["detail"][0]["msg"]
    assert stored_intervals(client) == 0
    assert client.post(BATCH, json={"intervals": records(1000)}).json() == {"accepted": 1000, "duplicates": 0}


def test_unknown_run_is_404(client, records):
    response = client.post("/api/v1/runs/nope/intervals", json={"intervals": records(1)})
    assert response.status_code == 404
    assert "'nope' is not stored" in response.json()["detail"]


def test_diverged_loss_is_stored_as_missing(client, run, records):
    recs = records(2)
    recs[1]["loss"] = float("nan")
    recs[1]["channel_loss"] = {"code": float("inf"), "text": 2.5}
    body = json.dumps({"intervals": recs})  # Python writes NaN/Infinity, as the agent's json.dumps would
    assert client.post(BATCH, content=body, headers={"Content-Type": "application/json"}).json()["accepted"] == 2
    rows = list(csv.DictReader(io.StringIO(client.get(f"{RUN}/intervals.csv").text)))
    assert rows[1]["loss"] == ""
    assert json.loads(rows[1]["channel_loss"]) == {"code": None, "text": 2.5}
    series = client.get(f"{RUN}/series").json()["columns"]
    assert series["loss"] == [pytest.approx(recs[0]["loss"]), None]


OPTIONAL_READINGS = [f for f in FIELDS if not f.required and f.kind == "float"]


@pytest.mark.parametrize("text", ["1e400", "-1e400"])
def test_readings_beyond_a_double_are_stored_as_missing(make_client, database_url, new_run, records, text):
    """JSON may write a number no double holds (1e400): every optional reading (and channel loss)
    so written is stored as missing, as docs/wire.md says of readings beyond ±1e300; the rest of
    the record is kept. A required float so written is refused, naming it."""
    client = make_client(database_url)
    assert client.post(RUNS, json=new_run()).status_code == 201
    recs = records(len(OPTIONAL_READINGS) + 1)
    for record, field in zip(recs, OPTIONAL_READINGS, strict=False):
        *parents, name = field.wire_path
        holder = record
        for parent in parents:
            holder = holder.setdefault(parent, {"util_pct": 50.0})
        holder[name] = 123456.789  # replaced by `text` in the JSON below
    recs[-1]["channel_loss"] = {"code": 123456.789, "text": 2.5}
    body = json.dumps({"intervals": recs}).replace("123456.789", text)
    answer = client.post(BATCH, content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 200, answer.text
    assert answer.json()["accepted"] == len(recs)
    rows = list(csv.DictReader(io.StringIO(client.get(f"{RUN}/intervals.csv").text)))
    for row, field in zip(rows, OPTIONAL_READINGS, strict=False):
        assert row[field.name] == "", field.name
        assert float(row["tokens"]) > 0 and row["loss" if field.name != "loss" else "lr"] != ""
    assert json.loads(rows[-1]["channel_loss"]) == {"code": None, "text": 2.5}

    required = json.dumps({"intervals": records(1, start=50)}).replace('"wall_end": ', f'"wall_end": {text}, "x": ')
    answer = client.post(BATCH, content=required, headers={"Content-Type": "application/json"})
    assert answer.status_code == 422, answer.text
    (error,) = answer.json()["detail"]
    assert error["loc"] == ["body", "intervals", 0, "wall_end"] and "1e+300" in error["msg"]


def test_tokens(make_client, new_run, records):
    client = make_client(ingest_token="write-secret", read_token="read-secret")
    write = {"Authorization": "Bearer write-secret"}
    read = {"Authorization": "Bearer read-secret"}

    missing = client.post(RUNS, json=new_run())
    assert missing.status_code == 401
    assert "PACKSCOPE_INGEST_TOKEN" in missing.json()["detail"]
    assert client.post(RUNS, json=new_run(), headers=read).status_code == 401
    assert client.post(RUNS, json=new_run(), headers=write).status_code == 201
    assert client.post(BATCH, json={"intervals": records(2)}).status_code == 401
    assert post_gzip(client, BATCH, {"intervals": records(2)}, **write).status_code == 200
    assert client.patch(RUN, json={"status": "failed"}).status_code == 401

    assert client.get(RUNS).status_code == 401
    assert "PACKSCOPE_READ_TOKEN" in client.get(RUN).json()["detail"]
    assert client.get(RUN, headers=write).status_code == 401
    assert client.get(RUN, headers=read).json()["records"] == 2
    assert client.get(f"{RUN}/intervals.csv", headers=read).status_code == 200


def test_open_reads_with_an_ingest_token(make_client, new_run):
    client = make_client(ingest_token="write-secret")
    assert client.post(RUNS, json=new_run(), headers={"Authorization": "Bearer write-secret"}).status_code == 201
    assert [r["run_id"] for r in client.get(RUNS).json()["runs"]] == ["run-1"]


def test_run_create_resume_and_conflict(client, new_run, records):
    created = client.post(RUNS, json=new_run())
    assert created.status_code == 201
    assert created.json()["c_lin"] > 0 and created.json()["totals"] is None
    client.post(BATCH, json={"intervals": records(3)})
    assert client.patch(RUN, json={"status": "failed"}).json()["ended_at"] is not None

    resumed = client.post(RUNS, json=new_run(name="renamed"))
    assert resumed.status_code == 200
    body = resumed.json()
    assert (body["name"], body["status"], body["ended_at"], body["records"]) == ("demo", "running", None, 3)

    other = new_run()
    other["model"]["layers"] = 5
    conflict = client.post(RUNS, json=other)
    assert conflict.status_code == 409
    assert "layers" in conflict.json()["detail"] and "new run_id" in conflict.json()["detail"]
    assert client.get(RUN).json()["model"]["layers"] == 4


def test_a_resume_that_keeps_status_leaves_a_finished_run_finished(client, new_run):
    """packscope sync and import register a run with keep_status: sending what a finished run left
    is not its trainer restarting."""
    assert client.post(RUNS, json=new_run()).status_code == 201
    ended = client.patch(RUN, json={"status": "finished", "ended_at": "2026-11-29T09:30:00Z"}).json()["ended_at"]
    again = client.post(RUNS, params={"keep_status": "true"}, json=new_run())
    assert again.status_code == 200
    assert (again.json()["status"], again.json()["ended_at"]) == ("finished", ended)
    assert (client.get(RUN).json()["status"], client.get(RUN).json()["ended_at"]) == ("finished", ended)
    other = new_run()
    other["model"]["layers"] = 5
    assert client.post(RUNS, params={"keep_status": "true"}, json=other).status_code == 409  # still checked
    assert client.post(RUNS, json=new_run()).json()["status"] == "running"  # the trainer's resume, as before


def test_run_body_validation(client, new_run):
    bad_id = client.post(RUNS, json=new_run(run_id="has space"))
    assert bad_id.status_code == 422 and bad_id.json()["detail"][0]["loc"] == ["body", "run_id"]
    typo = new_run()
    typo["model"]["hiden"] = 1
    response = client.post(RUNS, json=typo)
    assert response.status_code == 422
    assert "unknown model field(s) hiden" in response.json()["detail"][0]["msg"]
    impossible = new_run()
    impossible["model"]["hidden"] = 0
    refused = client.post(RUNS, json=impossible).json()["detail"][0]  # ModelSpec.from_dict's reading
    assert refused["loc"][:2] == ["body", "model"] and "'hidden' must be an integer from 1" in refused["msg"]
    assert client.get(RUNS).json() == {"runs": [], "total": 0}


def test_patch_sets_status_and_end(client, run):
    finished = client.patch(RUN, json={"status": "finished", "ended_at": "2026-11-29T09:30:00Z"})
    assert finished.status_code == 200
    assert (finished.json()["status"], finished.json()["ended_at"]) == ("finished", "2026-11-29T09:30:00Z")
    assert client.patch(RUN, json={"status": "done"}).status_code == 422
    assert client.patch(f"{RUNS}/other", json={"status": "failed"}).status_code == 404


@pytest.mark.parametrize(
    ("mutate", "loc", "words"),
    [
        (lambda r: r.update(gpu={"util_pct": 150.0}), ["gpu", "util_pct"], "<= 100"),
        (lambda r: r.update(grad_norm=-1.0), ["grad_norm"], ">= 0"),
        (lambda r: r.update(wall_end=r["wall_start"] - 1), [], "before wall_start"),
        (lambda r: r["syncs"]["sites"][0].update(site="a\x00b"), ["syncs", "sites", 0, "site"], "NUL"),
        (lambda r: r.update(channel_tokens={"c\x00de": 5}), ["channel_tokens", "c\x00de"], "NUL"),
        (lambda r: r.update(loss="2.5"), ["loss"], "got `str`"),
        (lambda r: r.update(last_step=2**63), ["last_step"], "<= 9223372036854775807"),
        (lambda r: r.update(gpu_time_s=5e-324), ["gpu_time_s"], "too small to store"),
        (lambda r: r.update(gpu={"energy_j": 2.2250738585072014e-308}), ["gpu", "energy_j"], "too small to store"),
        (lambda r: r["syncs"]["sites"][0].update(count="3"), ["syncs", "sites", 0, "count"], "got `str`"),
        (lambda r: r["syncs"]["sites"][0].update(count=True), ["syncs", "sites", 0, "count"], "got `bool`"),
        (lambda r: r["syncs"]["sites"][0].update(count=1.0), ["syncs", "sites", 0, "count"], "got `float`"),
    ],
)
def test_checks_after_parsing_name_the_record_and_field(client, run, records, mutate, loc, words):
    """What pydantic-core cannot check alone (bounds of optional readings, strings, the fields'
    relations) is checked over the whole batch afterwards, with the same kind of 422."""
    recs = records(5)
    mutate(recs[3])
    response = client.post(BATCH, content=json.dumps({"intervals": recs}), headers={"Content-Type": "application/json"})
    assert response.status_code == 422, response.text
    (error,) = response.json()["detail"]
    assert error["loc"][:3] == ["body", "intervals", 3]
    assert error["loc"][3:] == loc
    assert words in error["msg"]
    assert stored_intervals(client) == 0


def test_every_bad_record_of_a_batch_is_named(client, run, records):
    recs = records(40)
    recs[7]["real_tokens"] = recs[7]["tokens"] + 1
    recs[21]["first_step"] = recs[21]["last_step"] + 1
    recs[33]["syncs"]["sites"].append(dict(recs[33]["syncs"]["sites"][1]))
    recs[38]["gpu"] = {"power_w": -5.0}
    response = client.post(BATCH, json={"intervals": recs})
    assert response.status_code == 422
    assert [e["loc"][2] for e in response.json()["detail"]] == [7, 21, 33, 38]
    assert stored_intervals(client) == 0


def test_diverged_gpu_readings_are_stored_as_missing_and_the_rest_kept(client, run, records):
    recs = records(3)
    recs[0]["gpu"] = {"util_pct": 97.0, "power_w": 1e301, "energy_j": 975.0}
    recs[1]["gpu"] = {"util_pct": float("inf"), "power_w": 600.0}
    recs[2]["grad_norm"] = float("-inf")
    body = json.dumps({"intervals": recs})
    assert client.post(BATCH, content=body, headers={"Content-Type": "application/json"}).json()["accepted"] == 3
    rows = list(csv.DictReader(io.StringIO(client.get(f"{RUN}/intervals.csv").text)))
    assert (float(rows[0]["gpu_util_pct"]), rows[0]["gpu_power_w"], float(rows[0]["gpu_energy_j"])) == (97.0, "", 975.0)
    assert (rows[1]["gpu_util_pct"], float(rows[1]["gpu_power_w"])) == ("", 600.0)
    assert rows[2]["grad_norm"] == ""


def test_records_built_in_python_pass_the_same_checks(make_client, database_url, new_run, records):
    """ingest_batch (scripts, benchmarks) takes wire dicts, checked as the route checks them."""
    from packscope.backend.ingest.batches import ingest_batch
    from packscope.backend.ingest.record import RecordError
    from packscope.backend.store.runs import get_run

    client = make_client(database_url)
    assert client.post(RUNS, json=new_run()).status_code == 201
    recs = records(4)
    recs[1]["loss"] = float("nan")  # a diverged reading: stored as missing
    bad = [dict(recs[2], real_tokens=recs[2]["tokens"] + 1)]
    with client.app.state.sessionmaker() as session:
        run = get_run(session, "run-1")
        assert run is not None
        assert ingest_batch(session, run, recs[:3]).accepted == 3
        with pytest.raises(RecordError, match="padding included"):
            ingest_batch(session, run, bad)
        assert (ingest_batch(session, run, recs).accepted, ingest_batch(session, run, recs).duplicates) == (1, 4)
    rows = list(csv.DictReader(io.StringIO(client.get(f"{RUN}/intervals.csv").text)))
    assert [r["loss"] == "" for r in rows] == [False, True, False, False]


def test_the_batch_route_answers_as_fastapis_handler_without_resolving_dependencies(
    make_client, new_run, records, monkeypatch, tmp_path
):
    """POST .../intervals is served by routes.ingest._post_intervals: the ingest token checked by
    hand, before the body is read, with no dependency resolution per request; every answer (401,
    400, 413, 415, 422, 404, 200) is the one FastAPI's handler of the declared endpoint gives."""
    import fastapi.dependencies.utils
    import fastapi.routing

    from packscope.backend.routes import ingest as routes

    write = {"Authorization": "Bearer write-secret", "Content-Type": "application/json"}
    two = json.dumps({"intervals": records(2)}).encode()
    as_json = {"Content-Type": "application/json"}  # without it, 415 before anything (security.WriteGuard)
    cases = [
        (as_json, two, BATCH),
        ({**as_json, "Authorization": "Basic write-secret"}, two, BATCH),
        ({**as_json, "Authorization": "Bearer"}, two, BATCH),
        ({**as_json, "Authorization": "Bearer wrong"}, two, BATCH),
        ({**as_json, "Content-Encoding": "gzip"}, b"not gzip", BATCH),  # the token is checked first
        ({**write, "Content-Encoding": "br"}, two, BATCH),
        ({**write, "Content-Encoding": "gzip"}, b"not gzip", BATCH),
        ({**write, "Content-Encoding": "gzip"}, gzip.compress(two)[:-20], BATCH),
        (write, json.dumps({"intervals": records(40)}).encode(), BATCH),
        (write, b'{"intervals": [{"interval": -1}]}', BATCH),
        (write, b"{", BATCH),
        (write, two, BATCH),
        (write, two, BATCH),
        (write, two, "/api/v1/runs/nobody/intervals"),
    ]

    def answers(name: str) -> list[tuple[int, dict[str, str], bytes]]:
        url = f"sqlite:///{tmp_path / name}.db"
        client = make_client(database_url=url, ingest_token="write-secret", max_body_bytes=20_000)
        assert client.post(RUNS, json=new_run(), headers=write).status_code == 201
        out = []
        for headers, body, url in cases:
            response = client.post(url, content=body, headers=headers)
            out.append((response.status_code, dict(response.headers), response.content))
        return out

    with monkeypatch.context() as fastapis:
        fastapis.delattr(routes.post_intervals, "lean_handler")
        expected = answers("fastapi")
    resolved = 0
    solve = fastapi.routing.solve_dependencies

    async def counted(*args, **kwargs):
        nonlocal resolved
        resolved += 1
        return await solve(*args, **kwargs)

    monkeypatch.setattr(fastapi.routing, "solve_dependencies", counted)
    assert answers("lean") == expected
    assert [status for status, _, _ in expected] == [
        401,
        401,
        401,
        401,
        401,
        415,
        400,
        400,
        413,
        422,
        422,
        200,
        200,
        404,
    ]
    assert resolved == 1  # the run's creation; no batch


def test_the_batch_route_is_served_past_the_router_and_every_guard_still_runs(client, run, records, monkeypatch):
    """routes.ingest.BatchFastPath: a batch never reaches FastAPI's exit-stack middleware and the
    router behind it (a read still does), and the security middlewares outside still refuse it."""
    import fastapi.middleware.asyncexitstack as exit_stack

    routed = []
    through = exit_stack.AsyncExitStackMiddleware.__call__

    async def counted(self, scope, receive, send):
        routed.append(scope["path"])
        await through(self, scope, receive, send)

    monkeypatch.setattr(exit_stack.AsyncExitStackMiddleware, "__call__", counted)
    assert client.post(BATCH, json={"intervals": records(2)}).json() == {"accepted": 2, "duplicates": 0}
    assert client.post("/api/v1/runs/nobody/intervals", json={"intervals": records(1)}).status_code == 404
    assert client.post("/api/v1/runs/bad%20id/intervals", json={"intervals": records(1)}).status_code == 422
    assert routed == []
    assert client.get(RUN).status_code == 200
    assert routed == [RUN]
    # WriteGuard, outside: a form post is refused before the route sees it.
    refused = client.post(BATCH, content=b"intervals=1", headers={"Content-Type": "application/x-www-form-urlencoded"})
    assert refused.status_code == 415 and stored_intervals(client) == 2
    # Another method on the path still meets the router's 405.
    assert client.put(BATCH, json={}).status_code == 405 and routed[-1] == BATCH


def test_the_app_hands_a_batch_to_its_guards_past_fastapis_outer_layers_unless_telemetry_is_on(
    client, run, records, monkeypatch
):
    """server.app.PackscopeApp: a batch POST goes from the app straight to the outermost guard,
    past FastAPI's telemetry and body-limit layers (a read still passes them), within Starlette's
    server-error middleware (an unexpected error is a 500 still); with FastAPI's native telemetry
    configured it takes the ordinary way, so it is traced as every other request."""
    from starlette.testclient import TestClient

    telemetry = pytest.importorskip("fastapi.telemetry._asgi")  # FastAPI's native telemetry (0.16x)

    from packscope.backend.routes import ingest as routes

    seen = []
    through = telemetry.ExceptionTelemetryMiddleware.__call__

    async def counted(self, scope, receive, send):
        seen.append(scope["path"])
        await through(self, scope, receive, send)

    monkeypatch.setattr(telemetry.ExceptionTelemetryMiddleware, "__call__", counted)
    answer = client.post(BATCH, json={"intervals": records(2)})
    assert answer.json() == {"accepted": 2, "duplicates": 0}
    assert answer.headers["x-frame-options"] == "DENY" and "content-security-policy" in answer.headers
    assert seen == []
    assert client.get(RUN).status_code == 200 and seen == [RUN]
    # Configured telemetry: the batch goes the ordinary way (and is still served leanly inside).
    monkeypatch.setattr(telemetry.NativeTelemetry, "enabled", lambda self: True)
    monkeypatch.setattr(
        telemetry.NativeTelemetry, "__call__", lambda self, app, scope, receive, send, **_: app(scope, receive, send)
    )
    assert client.post(BATCH, json={"intervals": records(3)}).json() == {"accepted": 1, "duplicates": 2}
    assert seen == [RUN, BATCH]
    monkeypatch.undo()

    def broken(_body: bytes) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(routes, "parse", broken)
    lenient = TestClient(client.app, raise_server_exceptions=False)
    failed = lenient.post(BATCH, json={"intervals": records(1)})
    assert failed.status_code == 500 and failed.text == "Internal Server Error"
    with pytest.raises(RuntimeError, match="a bug"):  # and on up to the server, which logs it
        client.post(BATCH, json={"intervals": records(1)})
    assert stored_intervals(client) == 3


@pytest.mark.parametrize(
    "result", [(1, 0, []), (0, 1, []), (64, 0, []), (2**40, 7, []), (1, 1, ["gpu.extra", "unknown"])]
)
def test_the_batch_answer_is_the_models_own_json(result):
    from packscope.backend.api.schemas import IngestResult
    from packscope.backend.routes.ingest import answer_json

    accepted, duplicates, ignored = result
    model = IngestResult(accepted=accepted, duplicates=duplicates, ignored=ignored)
    assert answer_json(model) == model.model_dump_json(exclude_defaults=True).encode()


def test_sync_site_counts_at_the_int64_edge_are_stored_saturated(database_url, make_client, new_run, records):
    """Two records (and a second batch) with a site count of 2^63 - 1: the run's total for the
    site stops at 2^63 - 1 on both databases (SQLite raised OverflowError, a 500; across two
    batches it stored 2^64)."""
    client = make_client(database_url)
    assert client.post(RUNS, json=new_run()).status_code == 201
    recs = records(3)
    for r in recs:
        r["syncs"] = {"total": 2**63 - 1, "sites": [{"site": "train.py:1", "count": 2**63 - 1}]}
    assert client.post(BATCH, json={"intervals": recs[:2]}).json()["accepted"] == 2
    assert client.post(BATCH, json={"intervals": recs[2:]}).json()["accepted"] == 1
    (site,) = client.get(f"{RUN}/sync-sites").json()["sites"]
    assert site["site"] == "train.py:1" and site["count"] == 2**63 - 1


WRITES_TO_A_RUN = {
    "intervals": ("POST", BATCH, None),
    "refusals": (
        "POST",
        f"{RUN}/refusals",
        {"refusals": [{"interval": 0, "first_step": 1, "last_step": 10, "by": "agent", "reason": "x"}]},
    ),
    "heartbeat": ("POST", f"{RUN}/heartbeat", {"every_s": 30.0}),
    "patch": ("PATCH", RUN, {"status": "finished"}),
}


@pytest.mark.postgres
@pytest.mark.parametrize("write", list(WRITES_TO_A_RUN))
def test_a_write_racing_the_runs_delete_is_410_and_stores_nothing(make_client, postgres, new_run, records, write):
    """PostgreSQL: a write that finds the run while a DELETE of it is not yet committed waits for
    it and is then answered 410, as a write after the delete is (it was a 500: the rows' foreign
    key met the deleted run)."""
    import threading
    import time

    import psycopg

    client = make_client(postgres)
    assert client.post(RUNS, json=new_run()).status_code == 201
    method, url, body = WRITES_TO_A_RUN[write]
    body = body or {"intervals": records(3)}
    answers = []
    with psycopg.connect(postgres.replace("postgresql+psycopg", "postgresql")) as deleting:
        # The delete as routes/ingest.delete_run makes it, held open while the write comes.
        deleting.execute("DELETE FROM runs WHERE run_id = 'run-1'")
        deleting.execute("INSERT INTO deleted_runs (run_id, deleted_at) VALUES ('run-1', now())")

        def send() -> None:
            try:
                answers.append(client.request(method, url, json=body))
            except Exception as exc:  # noqa: BLE001 - the server's exception, shown by the assert below
                answers.append(exc)

        writer = threading.Thread(target=send)
        writer.start()
        deadline = time.monotonic() + 10
        while not deleting.execute("SELECT count(*) FROM pg_locks WHERE NOT granted").fetchone()[0]:
            assert time.monotonic() < deadline and writer.is_alive(), "the write did not wait for the delete"
            time.sleep(0.02)
        deleting.commit()
    writer.join(30)
    (answer,) = answers
    assert not isinstance(answer, Exception) and answer.status_code == 410, answer
    assert "was deleted" in answer.json()["detail"]
    with psycopg.connect(postgres.replace("postgresql+psycopg", "postgresql")) as check:
        for table in ("intervals", "refused_intervals", "rollups", "run_totals"):
            assert check.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, table
