"""Bursts against a real uvicorn server: every request is answered within a bounded time, with
2xx or 503/429 plus Retry-After (never 500, never a stall), and after retrying as told everything
is stored exactly once."""

import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from typing import Any

import httpx
import pytest
import uvicorn

from packscope.backend.http.settings import Settings
from packscope.backend.server.app import create_app
from packscope.core.ports import free_port

ANSWER_WITHIN_S = 10.0  # far below the 30 s pool timeout that the old deadlock ended in


@contextmanager
def running_server(database_url: str, **settings: Any) -> Iterator[str]:
    """A uvicorn server in a thread on a free loopback port; yields its URL."""
    port = free_port()
    app = create_app(Settings(database_url=database_url, ingest_token=None, read_token=None, **settings))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", backlog=2048))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 15
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(15)


def send_until_accepted(http: httpx.Client, method: str, path: str, body: Any, log: list[tuple[int, float]]) -> int:
    """Send, and on 503/429 wait Retry-After (plus jitter) and send again; log (status, seconds)."""
    while True:
        started = time.monotonic()
        answer = http.request(method, path, json=body)
        log.append((answer.status_code, time.monotonic() - started))
        if answer.status_code not in (429, 503):
            return answer.status_code
        assert answer.headers.get("retry-after", "").isdigit(), answer.headers
        time.sleep(int(answer.headers["retry-after"]) + random.uniform(0, 0.5))


def burst(url: str, calls: list[tuple[str, str, Any]]) -> tuple[list[int], list[tuple[int, float]]]:
    """All `calls` at once, one thread each; (final status of each call, every answer's log)."""
    log: list[tuple[int, float]] = []
    start = threading.Barrier(len(calls))

    def one(call: tuple[str, str, Any]) -> int:
        with httpx.Client(base_url=url, timeout=ANSWER_WITHIN_S) as http:
            start.wait()
            return send_until_accepted(http, *call, log)

    with ThreadPoolExecutor(len(calls)) as pool:
        finals = list(pool.map(one, calls))
    return finals, log


def assert_answered_well(log: list[tuple[int, float]]) -> None:
    codes = Counter(code for code, _ in log)
    assert set(codes) <= {200, 201, 429, 503}, codes
    assert max(seconds for _, seconds in log) < ANSWER_WITHIN_S


@pytest.mark.slow
def test_a_burst_of_runs_and_batches_is_answered_and_stored_once(database_url, new_run, records):
    with running_server(database_url) as url:
        runs = [("POST", "/api/v1/runs", new_run(f"run-{i}")) for i in range(100)]
        finals, log = burst(url, runs)
        assert Counter(finals) == {201: 100}
        assert_answered_well(log)

        # 50 ranks of one job flush the same interval at once; then all send it again (a replay).
        batches = [("POST", "/api/v1/runs/run-0/intervals", {"intervals": records(4, rank=rank)}) for rank in range(50)]
        finals, log = burst(url, batches)
        assert Counter(finals) == {200: 50}
        assert_answered_well(log)
        finals, log = burst(url, batches)
        assert Counter(finals) == {200: 50}
        assert_answered_well(log)

        listed = httpx.get(f"{url}/api/v1/runs", timeout=10).json()["runs"]
        assert sorted(r["run_id"] for r in listed) == sorted(f"run-{i}" for i in range(100))
        stored = httpx.get(f"{url}/api/v1/runs/run-0/intervals.csv", timeout=10).text.splitlines()
        assert len(stored) - 1 == 50 * 4  # header + one row per (rank, interval), none doubled


def test_a_full_queue_is_answered_503_with_retry_after_at_once(sqlite_url, new_run):
    # One slot and almost no patience: of 20 simultaneous writes, most are shed, fast.
    with running_server(sqlite_url, db_slots=1, queue_wait_s=0.01) as url:
        finals, log = burst(url, [("POST", "/api/v1/runs", new_run(f"run-{i}")) for i in range(20)])
        assert Counter(finals) == {201: 20}
        assert_answered_well(log)
        assert any(code == 503 for code, _ in log)


def test_batches_stored_together_are_answered_as_if_stored_one_after_another(
    make_client, database_url, new_run, records, oracle, close
):
    from packscope.backend.ingest.batches import ingest_together
    from packscope.backend.ingest.rows import parsed_records
    from packscope.backend.store.db import WRITES

    client = make_client(database_url)
    assert client.post("/api/v1/runs", json=new_run()).status_code == 201
    assert client.post("/api/v1/runs", json=new_run("run-2")).status_code == 201
    first, changed = records(8, seed=1), records(8, seed=2)  # the same keys with other numbers

    def batch(run_id: str, recs: list[dict[str, Any]]) -> tuple[str, Any]:
        copies = [{**r, "gpu": None, "channel_loss": None, "channel_tokens": None} for r in recs]
        return run_id, parsed_records(copies)

    engine = client.app.state.engine.execution_options(**{WRITES: True})
    results = ingest_together(
        engine,
        [
            batch("run-1", first[:5]),
            batch("run-1", changed[3:8]),  # 3 and 4 were sent just before: duplicates
            batch("nope", first[:2]),  # an unknown run: its own answer (404), nobody else's
            batch("run-2", changed[:2]),
            batch("run-1", first[:2] + first[:2]),  # all stored already, and repeated
        ],
    )
    assert [None if r is None else (r.accepted, r.duplicates) for r in results] == [
        (5, 0),
        (3, 2),
        None,
        (2, 0),
        (0, 4),
    ]
    stored = first[:5] + changed[5:8]  # the first record of a key wins
    totals = client.get("/api/v1/runs/run-1").json()["totals"]
    close(totals, oracle(stored), ["tokens", "real_tokens", "step_time_s", "tflops_thd", "loss"])
    assert client.get("/api/v1/runs/run-2").json()["records"] == 2


def test_the_coalescer_groups_waiting_items_and_isolates_a_failing_one():
    import anyio

    from packscope.backend.http.admission import Admission, Coalescer, Overloaded

    groups: list[list[str]] = []

    def work(items: list[str]) -> list[str]:
        groups.append(items)
        time.sleep(0.05)  # long enough for the others to queue behind the first
        if "bad" in items:
            raise ValueError("bad item")
        return [item.upper() for item in items]

    async def main() -> dict[str, Any]:
        coalescer = Coalescer(Admission(2, 5.0, 1, False), work, weigh=len, max_weight=9)
        answers: dict[str, Any] = {}

        async def one(item: str) -> None:
            try:
                answers[item] = await coalescer.submit(item)
            except ValueError as exc:
                answers[item] = str(exc)

        async with anyio.create_task_group() as tasks:
            for item in ("a", "bb", "bad", "ccc", "dddd", "e"):
                tasks.start_soon(one, item)
                await anyio.sleep(0.001)
        return answers

    answers = anyio.run(main)
    assert answers == {"a": "A", "bb": "BB", "bad": "bad item", "ccc": "CCC", "dddd": "DDDD", "e": "E"}
    assert groups[0] == ["a"]  # alone: nothing else was waiting yet
    assert ["bb", "bad", "ccc"] in groups  # together (8 <= 9), failed, then each alone
    assert ["bb"] in groups and ["bad"] in groups and ["ccc"] in groups
    assert all(sum(map(len, g)) <= 9 for g in groups)

    async def shed() -> list[Any]:
        slow = Coalescer(
            Admission(1, 0.02, 3, False), lambda items: (time.sleep(0.2), items)[1], weigh=len, max_weight=1
        )
        out: list[Any] = []

        async def one(item: str) -> None:
            try:
                out.append(await slow.submit(item))
            except Overloaded as exc:
                out.append(exc.retry_after_s)

        async with anyio.create_task_group() as tasks:
            for item in "xyz":
                tasks.start_soon(one, item)
        return out

    # The first is taken at once and answered however long it takes; the others were never
    # taken within 0.02 s: withdrawn, and answered 503 (Retry-After 3).
    assert sorted(map(str, anyio.run(shed))) == ["3", "3", "x"]


def test_each_waiting_item_is_withdrawn_at_its_own_deadline_and_a_cancelled_one_is_never_stored():
    import anyio

    from packscope.backend.http.admission import Admission, Coalescer, Overloaded

    groups: list[list[str]] = []

    def work(items: list[str]) -> list[str]:
        groups.append(items)
        time.sleep(0.3)  # holds the only slot: those behind it wait
        return items

    async def main() -> dict[str, Any]:
        waited: dict[str, Any] = {}

        async def one(coalescer: Coalescer[str, str], item: str) -> None:
            start = time.monotonic()
            try:
                waited[item] = await coalescer.submit(item)
            except Overloaded:
                waited[item] = ("503", time.monotonic() - start)

        shedding = Coalescer(Admission(1, 0.1, 2, False), work, weigh=len, max_weight=9)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(one, shedding, "first")
            await anyio.sleep(0.02)  # taken: the slot is held from now on
            tasks.start_soon(one, shedding, "early")
            await anyio.sleep(0.05)
            tasks.start_soon(one, shedding, "late")  # 0.05 s after "early": its deadline is its own
        # One cancelled before it is taken (its request's task ended): dropped, the next one stored.
        patient = Coalescer(Admission(1, 5.0, 2, False), work, weigh=len, max_weight=9)
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(one, patient, "held")
            await anyio.sleep(0.02)
            with anyio.CancelScope() as scope:
                scope.cancel()
                await patient.submit("gone")
            tasks.start_soon(one, patient, "kept")
        return waited

    waited = anyio.run(main)
    assert (waited["first"], waited["held"], waited["kept"]) == ("first", "held", "kept")
    for item in ("early", "late"):
        status, seconds = waited[item]
        assert status == "503" and 0.1 <= seconds < 0.25, (item, seconds)  # its own 0.1 s, not the other's
    assert groups == [["first"], ["held"], ["kept"]]  # neither withdrawn item, nor the cancelled one


def test_requests_one_after_another_set_one_expiry_timer_not_one_each():
    """The writer ends whenever the queue empties (light load); the next request must not set a
    second timer beside the one still set, or every firing after is doubled (and so on)."""
    import asyncio

    from packscope.backend.http.admission import Admission, Coalescer

    async def main() -> int:
        loop = asyncio.get_running_loop()
        armed = 0
        call_at = loop.call_at

        def counting(when, callback, *args, **kwargs):
            nonlocal armed
            armed += 1
            return call_at(when, callback, *args, **kwargs)

        loop.call_at = counting  # type: ignore[method-assign]
        coalescer = Coalescer(Admission(1, 5.0, 2, False), lambda items: items, weigh=len, max_weight=9)
        for k in range(5):
            assert await coalescer.submit(f"item-{k}") == f"item-{k}"
            assert coalescer._writer is not None
            await coalescer._writer  # the queue is empty: the writer has ended
        return armed

    assert asyncio.run(main()) == 1


def test_a_free_turn_is_taken_at_once_and_never_ahead_of_a_waiter():
    import anyio

    from packscope.backend.http.admission import Admission

    async def main() -> list[str]:
        admission = Admission(1, 5.0, 1, serialise_writes=True)
        order: list[str] = []

        async def other(name: str) -> None:
            order.append(f"{name} runs")
            async with admission.turn(writes=True):
                order.append(f"{name} holds")
                await anyio.sleep(0.01)

        async with anyio.create_task_group() as tasks:
            tasks.start_soon(other, "second")  # scheduled, not run yet
            # Free: taken without a trip through the event loop, so the other task has not run.
            async with admission.turn(writes=True):
                order.append("first holds")
            await anyio.sleep(0.001)  # "second" now holds the turn
            tasks.start_soon(other, "third")
            await anyio.sleep(0)
            async with admission.turn(writes=True):  # behind "third", which waits for "second"
                order.append("fourth holds")
        return order

    assert anyio.run(main) == [
        "first holds",
        "second runs",
        "second holds",
        "third runs",
        "third holds",
        "fourth holds",
    ]
