"""The alerts worker's background loops stop when cancelled, even when the event they wait for is
set in the same turn of the event loop: with Python 3.11's asyncio.wait_for the cancellation was
swallowed there, the loop went on waiting, and the server's shutdown (a TestClient's exit, a
SIGTERM) hung forever at the end of the parallel test pass."""

import asyncio

from packscope.backend.alerts.worker import _wait


async def _a_loop_cancelled_as_its_event_is_set() -> bool:
    event = asyncio.Event()

    async def loop() -> None:
        while True:  # as _judging and _delivering do
            await _wait(event, 10.0)
            event.clear()

    task = asyncio.create_task(loop())
    await asyncio.sleep(0.01)
    event.set()
    task.cancel()
    await asyncio.wait([task], timeout=2.0)
    return task.cancelled()


def test_a_loop_waiting_on_its_event_stops_when_cancelled_as_the_event_is_set():
    assert asyncio.run(_a_loop_cancelled_as_its_event_is_set())


def test_the_wait_ends_at_its_timeout_or_at_the_event():
    async def timings() -> tuple[bool, bool]:
        event = asyncio.Event()
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        await _wait(event, 0.05)  # times out quietly
        timed_out = loop.time() - t0 >= 0.04
        loop.call_later(0.01, event.set)
        t1 = loop.time()
        await _wait(event, 10.0)
        return timed_out, loop.time() - t1 < 5.0

    assert asyncio.run(timings()) == (True, True)
