"""Alerts (docs/alerts.md): every rule opens after the documented number of intervals and resolves,
each open and each resolve is one signed webhook message, a change of the documents' length mix at
constant efficiency fires nothing, and no rule fires on any run of the gallery."""

from __future__ import annotations

import copy
import json
import math
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from alert_receiver import Receiver
from fastapi.testclient import TestClient
from sqlalchemy import event, func, select
from wire_records import packed_interval

from packscope.backend.alerts.inputs import read_intervals, run_row
from packscope.backend.alerts.rules import Thresholds, _others_median
from packscope.backend.alerts.worker import run_pks_of
from packscope.backend.store.models import alert_outbox
from packscope.core.flops import ModelSpec
from packscope.core.run_file import read_run_file
from packscope.gallery import run_files

from .conftest import MODEL, run_body

T = Thresholds()
BASE = T.warmup_intervals + T.baseline_intervals  # intervals before any later one is judged
SECRET = "s3cret"


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver(SECRET)
    yield r
    r.close()


@pytest.fixture
def alerting(make_client: Callable[..., TestClient], receiver: Receiver) -> TestClient:
    return make_client(
        alert_webhook_url=receiver.url,
        alert_webhook_secret=SECRET,
        alert_delivery_poll_s=0.05,
        alert_retry_base_s=0.05,
        public_url="http://dash.example",
    )


def create(client: TestClient, run_id: str = "run-a", **overrides: Any) -> None:
    body = run_body(run_id, hardware={"gpu_name": "NVIDIA H200", "gpu_count": 1, "peak_tflops": 989.0}, **overrides)
    assert client.post("/api/v1/runs", json=body).status_code == 201


def send(client: TestClient, run_id: str, records: list[dict[str, Any]]) -> None:
    # json.dumps writes NaN as NaN, as Python's json does for a diverged loss
    answer = client.post(
        f"/api/v1/runs/{run_id}/intervals",
        content=json.dumps({"intervals": records}),
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 200, answer.text


def judge(client: TestClient, run_id: str) -> None:
    worker = client.app.state.alerts  # type: ignore[attr-defined]
    worker.judge_now(run_pks_of(worker.engine, [run_id]))


@contextmanager
def statements_on(engine: Any) -> Iterator[list[str]]:
    """The SQL statements `engine` runs inside the block, as they run."""
    statements: list[str] = []
    listen = lambda *a: statements.append(a[2])  # noqa: E731  (conn, cursor, statement, ...)
    event.listen(engine, "before_cursor_execute", listen)
    try:
        yield statements
    finally:
        event.remove(engine, "before_cursor_execute", listen)


def alerts_of(client: TestClient, run_id: str) -> list[dict[str, Any]]:
    answer = client.get(f"/api/v1/runs/{run_id}/alerts")
    assert answer.status_code == 200, answer.text
    return answer.json()


def open_rules(client: TestClient, run_id: str) -> list[tuple[str, str]]:
    return sorted((a["rule"], a["subject"]) for a in alerts_of(client, run_id) if a["resolved_at"] is None)


def interval(k: int, rank: int = 0, **kw: Any) -> dict[str, Any]:
    record = packed_interval(k, loss=2.0, **kw)
    record["rank"] = rank
    return record


def feed(client: TestClient, run_id: str, records: list[dict[str, Any]]) -> list[list[tuple[str, str]]]:
    """Send the records one interval at a time, judging after each; the open alerts after each."""
    by_interval: dict[int, list[dict[str, Any]]] = {}
    for r in records:
        by_interval.setdefault(r["interval"], []).append(r)
    seen = []
    for k in sorted(by_interval):
        send(client, run_id, by_interval[k])
        judge(client, run_id)
        seen.append(open_rules(client, run_id))
    return seen


# -- slowdown -------------------------------------------------------------------------------------
def test_slowdown_opens_after_its_streak_resolves_after_one_and_sends_one_signed_message_each(
    alerting: TestClient, receiver: Receiver
):
    create(alerting)
    n = T.slowdown_intervals
    fast, slow = 0.5, 0.5 / 0.6  # the slow intervals do the same work at 60% of the rate: 40% slower
    times = [fast] * BASE + [slow] * n + [fast] * n
    seen = feed(alerting, "run-a", [interval(k, gpu_time_s=t) for k, t in enumerate(times)])
    opened_at = BASE + n - 1  # the n-th slow interval
    assert all(s == [] for s in seen[:opened_at]), seen
    assert seen[opened_at] == [("slowdown", "")]
    assert all(s == [("slowdown", "")] for s in seen[opened_at : opened_at + n]), seen
    assert seen[-1] == []  # the n-th fast one resolves it
    (alert,) = alerts_of(alerting, "run-a")
    assert alert["details"]["drop_pct"] == pytest.approx(100 * (1 - fast / slow))
    assert alert["details"]["metric"] == "tflops_thd"
    assert alert["run_url"] == "http://dash.example/runs/run-a"
    receiver.wait_for(2)
    time.sleep(0.3)  # nothing more comes
    assert receiver.events() == [("alert.opened", "slowdown", ""), ("alert.resolved", "slowdown", "")]
    assert all(receiver.signed(m) for m in receiver.messages)
    ids = [m["headers"]["X-Packscope-Event-Id"] for m in receiver.messages]
    assert ids == [f"packscope-alert-{alert['id']}-opened", f"packscope-alert-{alert['id']}-resolved"]
    resolved = receiver.messages[1]["json"]["alert"]
    assert resolved["resolved_at"] == alert["resolved_at"] and resolved["summary"] == alert["summary"]


def _flops_thd(spec: ModelSpec, record: dict[str, Any]) -> float:
    # independent of the server's catalogue: FLOPs = T·C_lin + Σ s_i²·C_core (docs/flops.md)
    return record["tokens"] * spec.c_lin + record["seqlen_sq_sum_thd"] * spec.c_core_by_kind["full"]


def test_a_change_of_document_mix_at_constant_efficiency_fires_no_slowdown(client: TestClient):
    spec = ModelSpec.from_dict(dict(MODEL))
    create(client)
    rate = 2e12  # FLOP/s, the same all run long
    short = [interval(k, pack=16384, docs_per_pack=32, doc_len=512) for k in range(BASE + 4)]
    long = [interval(k, pack=16384, docs_per_pack=1, doc_len=16384) for k in range(BASE + 4, BASE + 12)]
    records = short + long
    for r in records:
        r["gpu_time_s"] = _flops_thd(spec, r) / rate
        r["wall_end"] = r["wall_start"] + r["gpu_time_s"]
        r["host_time_s"] = r["gpu_time_s"]
    # The mix alone makes every step slower by more than the threshold: tokens per second drop.
    tokens_rate = [r["tokens"] / r["gpu_time_s"] for r in (short[-1], long[0])]
    assert 100 * (1 - tokens_rate[1] / tokens_rate[0]) > 2 * T.slowdown_pct
    seen = feed(client, "run-a", records)
    assert all(s == [] for s in seen), seen


# -- straggler, sync regression, non-finite loss, MFU floor ------------------------------------------
def test_a_straggler_names_its_rank_and_host_and_resolves(client: TestClient):
    create(client, parallel={"dp": 4}, config={"hosts": ["node-a", "node-a", "node-b", "node-b"]})
    n = T.straggler_intervals
    records = []
    for k in range(BASE + 2 * n + 1):
        slow = BASE + 1 <= k < BASE + 1 + n
        for rank in range(4):
            records.append(interval(k, rank, gpu_time_s=0.8 if slow and rank == 2 else 0.5))
    seen = feed(client, "run-a", records)
    assert seen[BASE + n - 1] == [] and seen[BASE + n] == [("straggler", "rank 2")]
    assert seen[-1] == []
    (alert,) = alerts_of(client, "run-a")
    assert alert["details"]["host"] == "node-b" and alert["ledger_term"] == "stragglers"
    assert alert["details"]["slower_pct"] == pytest.approx(60.0)


def test_a_straggler_among_many_ranks_is_judged_from_the_rank_summaries_alone(client: TestClient):
    """40 ranks of spread step times (more than the slowest kept per interval, several to a
    bucket): rank 7, 40% slower for a streak, opens an alert whose figure is the one computed
    here from every rank's times; the ranks just below the slowest kept fire nothing; and no
    judging round reads a rank's row (only the summaries), however many ranks."""
    ranks = 40
    create(client, parallel={"dp": ranks})
    n = T.straggler_intervals
    times = [0.5 * (1 + 0.002 * r) for r in range(ranks)]  # 0.5 .. 0.539 s: up to 8% apart, no straggler
    slow = range(BASE + 1, BASE + 1 + n)
    records, expected = [], []
    for k in range(BASE + 2 * n + 1):
        these = [t * 1.4 if k in slow and r == 7 else t for r, t in enumerate(times)]
        records += [interval(k, r, gpu_time_s=t) for r, t in enumerate(these)]
        if k in slow:  # rank 7's time over the median of the other ranks' (steps cancel)
            expected.append(these[7] / statistics.median(t for r, t in enumerate(these) if r != 7))
    with statements_on(client.app.state.alerts.engine) as statements:  # type: ignore[attr-defined]
        seen = feed(client, "run-a", records)
    assert seen[BASE + n] == [("straggler", "rank 7")] and seen[-1] == [], seen
    (alert,) = alerts_of(client, "run-a")
    assert alert["details"]["ratios"] == pytest.approx(expected, rel=3e-3)  # a bucket's width: 0.27%
    assert alert["details"]["slower_pct"] == pytest.approx(100 * (statistics.median(expected) - 1), rel=1e-2)
    judged = [q for q in statements if "rank_slowest" in q]
    assert judged, "the judging rounds read the rank summaries"
    assert not [q for q in statements if "interval_details" in q and "sync_sites" in q], "a rank's row was read"


@pytest.mark.parametrize("ranks", [2, 3, 7, 8, 400, 401])
def test_a_round_reads_the_buckets_around_the_median_alone_and_gets_the_others_median(
    make_client: Callable[..., TestClient], database_url: str, ranks: int
):
    """A judging round keeps of each interval's step-time buckets only those around its median
    (inputs._near_median), whatever the spread of its ranks' times: 400 ranks 0.1% apart fill
    about 120 buckets, and at most 3 are kept. Whichever rank is left out, the other ranks' median
    from those is statistics.median of the others' times, within a bucket's width."""
    client = make_client(database_url)
    create(client, parallel={"dp": ranks})
    times = [0.5 * (1 + 0.001 * ((r * 37) % ranks)) for r in range(ranks)]  # spread, not in rank order
    send(client, "run-a", [interval(k, r, gpu_time_s=t) for k in range(2) for r, t in enumerate(times)])
    engine = client.app.state.alerts.engine  # type: ignore[attr-defined]
    (run_pk,) = run_pks_of(engine, ["run-a"])
    with engine.connect() as connection:
        read = read_intervals(connection, run_row(connection, run_pk), T)
    assert [i.interval for i in read] == [0, 1]
    steps = interval(0)["steps"]
    ascending = sorted(t / steps for t in times)  # step times
    for i in read:
        assert i.ranks == ranks and len(i.buckets) <= 3, i.buckets  # the median's 3 places, not the spread
        if ranks > 8:
            assert i.below_buckets > ranks // 3  # those below the median's were left out
        for position in range(1, ranks + 1):  # the rank at each place from the fastest, left out
            others = ascending[: position - 1] + ascending[position:]
            assert _others_median(i, position) == pytest.approx(statistics.median(others), rel=3e-3), position


def test_an_intervals_totals_kept_between_rounds_follow_its_late_ranks(client: TestClient):
    """The sums and step-time buckets a round reads are kept for the next (inputs._interval_totals):
    a round with nothing new reads neither; a rank's row that arrives after a round makes the next
    one read that interval again, its buckets counting the late rank."""
    create(client, parallel={"dp": 2})
    engine = client.app.state.alerts.engine  # type: ignore[attr-defined]
    (run_pk,) = run_pks_of(engine, ["run-a"])
    statements: list[str] = []

    def read() -> dict[int, tuple[int, float, int]]:
        with statements_on(engine) as ran, engine.connect() as connection:
            read = read_intervals(connection, run_row(connection, run_pk), T)
        statements[:] = ran
        return {
            i.interval: (i.ranks, i.sums["tokens"], i.below_buckets + sum(n for n, _, _ in i.buckets)) for i in read
        }

    first = [interval(k, 0, steps=10) for k in range(3)]
    send(client, "run-a", first)
    assert read() == {k: (1, first[k]["tokens"], 1) for k in range(3)}
    assert [q for q in statements if "rank_time_buckets" in q] and [q for q in statements if "FROM intervals" in q]
    assert read() == {k: (1, first[k]["tokens"], 1) for k in range(3)}  # kept, unchanged
    assert not [q for q in statements if "rank_time_buckets" in q or "FROM intervals" in q], statements
    late = interval(1, 1, steps=20)  # rank 1 of interval 1 only: interval 1 is whole, 0 and 2 are not
    send(client, "run-a", [late])
    assert read() == {1: (2, first[1]["tokens"] + late["tokens"], 2)}


def test_a_sync_regression_names_the_new_site(client: TestClient):
    create(client)
    n = T.sync_intervals
    records = [interval(k) for k in range(BASE + n)]
    for r in records[BASE:]:  # from here, 4 more syncs per step at a new line
        r["syncs"] = {"total": 70, "sites": [{"site": "train.py:88", "count": 30}, {"site": "loss.py:12", "count": 40}]}
    seen = feed(client, "run-a", records)
    assert seen[-2] == [] and seen[-1] == [("sync_regression", "loss.py:12")]
    (alert,) = alerts_of(client, "run-a")
    assert alert["details"]["baseline"] == 3.0 and alert["details"]["recent"] == 7.0
    assert alert["details"]["site_increase_per_iter"] == 4.0 and alert["ledger_term"] == "host_syncs"
    later = [interval(k) for k in range(BASE + n, BASE + 2 * n)]
    assert feed(client, "run-a", later)[-1] == []


def test_a_nonfinite_loss_opens_at_once_and_finite_ones_resolve_it(client: TestClient):
    create(client)
    records = [interval(k) for k in range(4)]
    records[2]["loss"] = math.nan
    records[3]["loss"] = math.inf
    seen = feed(client, "run-a", records)
    assert seen[1] == [] and seen[2] == [("nonfinite_loss", "")]
    more = feed(client, "run-a", [interval(k) for k in range(4, 4 + T.nonfinite_resolve_intervals)])
    assert more[-2] == [("nonfinite_loss", "")] and more[-1] == []


def settle(client: TestClient, run_id: str, rounds: int = 4) -> None:
    """Judging rounds until one changes nothing (the server's own worker may judge in between)."""
    for _ in range(rounds):
        worker = client.app.state.alerts  # type: ignore[attr-defined]
        if worker.judge_now(run_pks_of(worker.engine, [run_id])) == 0:
            return


def history(client: TestClient, run_id: str) -> list[tuple[str, str, bool]]:
    return sorted((a["rule"], a["subject"], a["resolved_at"] is not None) for a in alerts_of(client, run_id))


def test_a_nonfinite_loss_judged_only_after_its_resolving_streak_opens_then_resolves_once(client: TestClient):
    """The finite intervals after a NaN may come in its batch, or before the next judging round
    (a busy server, the agent's backlog sent at once): the NaN is still reported, once."""
    create(client)
    records = [interval(k) for k in range(3 + T.nonfinite_resolve_intervals)]
    records[2]["loss"] = math.nan
    send(client, "run-a", records)  # the NaN and its resolving streak, judged together
    settle(client, "run-a")  # one round opens it, the next resolves it
    assert history(client, "run-a") == [("nonfinite_loss", "", True)]
    assert alerts_of(client, "run-a")[0]["details"]["interval"] == 2
    feed(client, "run-a", [interval(k) for k in range(len(records), len(records) + 2)])
    settle(client, "run-a")  # a reported NaN does not open again
    assert history(client, "run-a") == [("nonfinite_loss", "", True)]


def test_a_slowdown_that_opened_and_ended_between_two_rounds_is_reported_once(alerting: TestClient, receiver: Receiver):
    create(alerting)
    n = T.slowdown_intervals
    fast, slow = 0.5, 0.5 / 0.6
    times = [fast] * BASE + [slow] * n + [fast] * n
    send(alerting, "run-a", [interval(k, gpu_time_s=t) for k, t in enumerate(times)])  # judged after all came
    settle(alerting, "run-a")
    assert history(alerting, "run-a") == [("slowdown", "", True)]
    (alert,) = alerts_of(alerting, "run-a")
    assert alert["details"]["intervals"] == list(range(BASE, BASE + n))  # the slow ones, not the latest
    assert alert["details"]["drop_pct"] == pytest.approx(100 * (1 - fast / slow))
    assert alert["details"]["resolved_through"] == len(times) - 1
    receiver.wait_for(2)
    feed(alerting, "run-a", [interval(len(times) + k, gpu_time_s=fast) for k in range(2)])
    settle(alerting, "run-a")  # later rounds see the same slow streak, reported already
    time.sleep(0.3)
    assert receiver.events() == [("alert.opened", "slowdown", ""), ("alert.resolved", "slowdown", "")]
    # a second slowdown, again judged only after it ended, is a second alert
    more = len(times) + 2
    send(alerting, "run-a", [interval(more + k, gpu_time_s=t) for k, t in enumerate([slow] * n + [fast] * n)])
    settle(alerting, "run-a")
    assert history(alerting, "run-a") == [("slowdown", "", True)] * 2


def test_a_loss_never_sent_is_not_a_nonfinite_one(client: TestClient):
    create(client)
    records = [packed_interval(k) for k in range(8)]  # loss None
    assert all(s == [] for s in feed(client, "run-a", records))


def test_the_mfu_floor_is_off_until_set_per_project_through_the_api(client: TestClient):
    create(client)
    records = [interval(k) for k in range(4)]
    assert feed(client, "run-a", records)[-1] == []
    answer = client.patch("/api/v1/alerts/settings?project=tests", json={"mfu_floor": 0.5})
    assert answer.status_code == 200, answer.text
    assert answer.json()["thresholds"]["mfu_floor"] == 0.5
    assert client.get("/api/v1/alerts/settings").json()["thresholds"]["mfu_floor"] is None  # server-wide: off
    judge(client, "run-a")
    assert open_rules(client, "run-a") == [("mfu_floor", "")]
    client.patch("/api/v1/alerts/settings?project=tests", json={"mfu_floor": None})
    judge(client, "run-a")
    assert open_rules(client, "run-a") == []


def test_thresholds_are_checked(client: TestClient):
    assert client.patch("/api/v1/alerts/settings", json={"slowdown_pct": -1}).status_code == 422
    assert client.patch("/api/v1/alerts/settings", json={"no_such": 1}).status_code == 422
    assert client.patch("/api/v1/alerts/settings?project=p", json={"webhook_urls": ["http://x"]}).status_code == 422
    # A webhook address holds no whitespace nor control character, \x85 (NEL, schemathesis found
    # it: regex engines disagree on whether \s matches it) and \x1f too.
    for url in ("http://w\x85a", "http://w\x1fa", "http://w a", "https://w\u3000a"):
        assert client.patch("/api/v1/alerts/settings", json={"webhook_urls": [url]}).status_code == 422, url
    # Booleans are no numbers (pydantic's lax mode read them as 1 and 0; schemathesis found it).
    for body in ({"sync_min_increase": False}, {"sync_intervals": True}, {"mfu_floor": True}, {"sync_intervals": "3"}):
        assert client.patch("/api/v1/alerts/settings", json=body).status_code == 422, body
    assert client.patch("/api/v1/alerts/settings", json={"sync_intervals": 2.5}).status_code == 422
    assert client.get("/api/v1/alerts/settings").json()["stored"] == {}
    # An integral number is an integer as JSON Schema reads it (schemathesis sent 745.0).
    answer = client.patch("/api/v1/alerts/settings", json={"sync_intervals": 745.0, "sync_min_increase": 2})
    assert answer.status_code == 200, answer.text
    assert answer.json()["thresholds"]["sync_intervals"] == 745
    assert answer.json()["thresholds"]["sync_min_increase"] == 2.0
    with pytest.raises(ValueError, match="PACKSCOPE_ALERT_THRESHOLDS"):
        from packscope.backend.http.settings import Settings

        Settings(alert_thresholds="{not json")


# -- stalled and crashed ------------------------------------------------------------------------------
def test_stalled_opens_past_the_runs_cadence_and_its_streak_of_intervals_resolves_it(
    make_client: Callable[..., TestClient],
):
    # The records' intervals end 1 s apart: the limit is the floor, 1.5 s (the factor is small).
    client = make_client(alert_thresholds=json.dumps({"stalled_floor_s": 1.5, "stalled_gap_factor": 0.1}))
    create(client)
    feed(client, "run-a", [interval(k) for k in range(3)])
    assert open_rules(client, "run-a") == []
    time.sleep(1.7)
    judge(client, "run-a")
    (alert,) = alerts_of(client, "run-a")
    assert alert["rule"] == "stalled" and alert["details"]["median_gap_s"] == pytest.approx(1.0)
    assert alert["details"]["limit_s"] == pytest.approx(1.5)
    n = T.stalled_resolve_intervals
    after = [interval(k) for k in range(3, 4 + n)]
    for record in after:  # the trainer hung 10 s before interval 3 ended: its clock says so too
        record["wall_start"] += 10.0
        record["wall_end"] += 10.0
    seen = feed(client, "run-a", after)
    # Interval 3 ended 11 s after interval 2: one interval back, not a streak at the run's cadence.
    assert seen == [[("stalled", "")]] * n + [[]], seen


def test_a_failed_run_opens_crashed_and_a_restart_resolves_it(client: TestClient):
    create(client)
    assert client.patch("/api/v1/runs/run-a", json={"status": "failed"}).status_code == 200
    judge(client, "run-a")
    assert open_rules(client, "run-a") == [("crashed", "")]
    assert client.patch("/api/v1/runs/run-a", json={"status": "running"}).status_code == 200
    judge(client, "run-a")
    assert open_rules(client, "run-a") == []


# -- the lists -----------------------------------------------------------------------------------------
def test_the_alerts_list_by_state(client: TestClient):
    create(client, "run-a")
    create(client, "run-b")
    for run_id in ("run-a", "run-b"):
        client.patch(f"/api/v1/runs/{run_id}", json={"status": "failed"})
        judge(client, run_id)
    client.patch("/api/v1/runs/run-b", json={"status": "running"})
    judge(client, "run-b")
    listed = {state: client.get(f"/api/v1/alerts?state={state}").json() for state in ("open", "resolved", "all")}
    assert [a["run_id"] for a in listed["open"]] == ["run-a"]
    assert [a["run_id"] for a in listed["resolved"]] == ["run-b"]
    assert sorted(a["run_id"] for a in listed["all"]) == ["run-a", "run-b"]
    assert client.get("/api/v1/alerts?state=closed").status_code == 422
    assert client.get("/api/v1/runs/nope/alerts").status_code == 404


# -- delivery ----------------------------------------------------------------------------------------
def test_a_receiver_that_is_down_gets_each_message_once_when_it_is_back(alerting: TestClient, receiver: Receiver):
    receiver.down = True
    create(alerting)
    alerting.patch("/api/v1/runs/run-a", json={"status": "failed"})
    judge(alerting, "run-a")
    deadline = time.monotonic() + 10
    while receiver.refused < 3 and time.monotonic() < deadline:  # retried with backoff
        time.sleep(0.02)
    assert receiver.refused >= 3 and receiver.messages == []
    receiver.down = False
    receiver.wait_for(1)
    time.sleep(0.3)
    assert receiver.events() == [("alert.opened", "crashed", "")]
    engine = alerting.app.state.engine  # type: ignore[attr-defined]
    with engine.connect() as connection:
        sent = connection.execute(select(func.count()).where(alert_outbox.c.sent_at.is_not(None))).scalar()
    assert sent == 1


def test_slack_messages_are_text(make_client: Callable[..., TestClient], receiver: Receiver):
    client = make_client(alert_webhook_url=receiver.url, alert_webhook_format="slack", alert_delivery_poll_s=0.05)
    create(client)
    client.patch("/api/v1/runs/run-a", json={"status": "failed"})
    judge(client, "run-a")
    receiver.wait_for(1)
    (message,) = receiver.messages
    assert set(message["json"]) == {"text"} and "crashed" in message["json"]["text"]
    assert "X-Packscope-Signature" not in message["headers"]  # no secret, no signature


def test_webhooks_set_through_the_api_replace_the_environments(client: TestClient, receiver: Receiver):
    answer = client.patch("/api/v1/alerts/settings", json={"webhook_urls": [receiver.url], "webhook_secret": SECRET})
    assert answer.status_code == 200, answer.text
    assert answer.json()["webhook_secret_set"] is True and answer.json()["stored"]["webhook_secret"] == "(set)"
    create(client)
    client.patch("/api/v1/runs/run-a", json={"status": "failed"})
    judge(client, "run-a")
    receiver.wait_for(1)
    assert receiver.signed(receiver.messages[0])


# -- no false alarms ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_no_rule_fires_on_any_gallery_run(client: TestClient):
    files = run_files()
    assert files
    for path in files:
        run_file = read_run_file(path)
        run = {k: v for k, v in copy.deepcopy(run_file.run).items() if k not in ("status", "ended_at")}
        assert client.post("/api/v1/runs", json=run).status_code == 201
        seen = feed(client, run["run_id"], list(run_file.records))
        assert all(s == [] for s in seen), (path.name, seen)
        client.patch(f"/api/v1/runs/{run['run_id']}", json={"status": run_file.run.get("status", "finished")})
        judge(client, run["run_id"])
    assert client.get("/api/v1/alerts?state=all").json() == []
