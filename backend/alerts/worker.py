"""The alerts' background work in each server process, off the ingest path: judging runs (woken
by each stored batch, and every sweep_s for the runs whose silence alone can open or resolve an
alert) and sending the outbox. Ingest only sets an event (`wake`); a slow database read here or
a slow webhook receiver never holds a request."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Iterable

from sqlalchemy import Engine, select

from packscope.backend.alerts.config import AlertConfig
from packscope.backend.alerts.delivery import Deliverer
from packscope.backend.alerts.evaluate import evaluate_run
from packscope.backend.alerts.state import runs_with_open_alerts
from packscope.backend.store.models import Run

log = logging.getLogger("packscope.alerts")
_RUNS = Run.__table__


def live_runs(engine: Engine) -> set[int]:
    """The runs a sweep judges without new data: stored running (stalled, stale, crashed come from
    their silence) or holding an open alert (which may resolve)."""
    with engine.connect() as connection:
        running = connection.execute(select(_RUNS.c.id).where(_RUNS.c.status == "running")).scalars().all()
        return {*running, *runs_with_open_alerts(connection)}


def run_pks_of(engine: Engine, run_ids: Iterable[str]) -> set[int]:
    ids = list(run_ids)
    if not ids:
        return set()
    with engine.connect() as connection:
        return set(connection.execute(select(_RUNS.c.id).where(_RUNS.c.run_id.in_(ids))).scalars())


STOP_TIMEOUT_S = 10.0


async def _wait(event: asyncio.Event, timeout_s: float) -> None:
    """Until `event` is set or `timeout_s` passes. asyncio.timeout, not wait_for: on Python 3.11,
    wait_for returns normally when a cancellation and the event arrive together, so a stopping
    task could swallow its cancel and the server's shutdown waited for it forever."""
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(timeout_s):
            await event.wait()


class _Running:
    """One start of the worker, in the event loop that runs it: its events, runs to judge and tasks
    (an app's lifespan may run in more than one loop at once: tests start an app twice)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, deliverer: Deliverer) -> None:
        self.loop, self.deliverer = loop, deliverer
        self.judge, self.send = asyncio.Event(), asyncio.Event()
        self.changed: set[str] = set()
        self.tasks: list[asyncio.Task[None]] = []

    def woken(self, run_id: str) -> None:
        self.changed.add(run_id)
        self.judge.set()


class AlertWorker:
    def __init__(self, engine: Engine, config: AlertConfig) -> None:
        self.engine, self.config = engine, config
        self._running: list[_Running] = []

    def wake(self, run_id: str) -> None:
        """A batch of `run_id` was stored, or its status set: judge it soon (a set add and an event,
        nothing else; from the event loop or from a route's worker thread)."""
        try:
            here: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            here = None
        for running in list(self._running):
            if running.loop is here:
                running.woken(run_id)
            else:
                running.loop.call_soon_threadsafe(running.woken, run_id)

    async def start(self) -> None:
        running = _Running(asyncio.get_running_loop(), Deliverer(self.engine, self.config))
        running.tasks = [asyncio.create_task(self._judging(running)), asyncio.create_task(self._delivering(running))]
        self._running.append(running)

    async def stop(self) -> None:
        here = asyncio.get_running_loop()
        for running in [r for r in self._running if r.loop is here]:
            self._running.remove(running)
            for task in running.tasks:
                task.cancel()
            # Bounded: a shutdown must end even if a task were to outlive its cancellation.
            _, alive = await asyncio.wait(running.tasks, timeout=STOP_TIMEOUT_S)
            if alive:
                log.warning("alerts: %d background task(s) did not stop within %s s", len(alive), STOP_TIMEOUT_S)
            await running.deliverer.aclose()

    def judge_now(self, run_pks: Iterable[int]) -> int:
        """Judge these runs (in this thread); how many alerts opened or resolved."""
        taken = 0
        for run_pk in sorted(run_pks):
            try:
                taken += len(evaluate_run(self.engine, run_pk, self.config))
            except Exception:  # one run's failure must not stop the others' alerts
                log.exception("judging run %s for alerts failed", run_pk)
        return taken

    async def _judging(self, running: _Running) -> None:
        next_sweep = 0.0
        while True:
            timeout = max(0.0, next_sweep - time.monotonic())
            await _wait(running.judge, timeout)
            running.judge.clear()
            changed, running.changed = running.changed, set()
            try:
                pks = await asyncio.to_thread(run_pks_of, self.engine, changed)
                if time.monotonic() >= next_sweep:
                    pks |= await asyncio.to_thread(live_runs, self.engine)
                    next_sweep = time.monotonic() + self.config.sweep_s
                taken: int = await asyncio.to_thread(self.judge_now, pks) if pks else 0
                if taken:
                    running.send.set()
            except Exception:
                log.exception("the alerts' judging round failed")
                await asyncio.sleep(self.config.sweep_s)
            # Batches that arrive meanwhile wait for the next round together: a run is judged at
            # most once every judge_gap_s, however small and frequent its batches.
            await asyncio.sleep(self.config.judge_gap_s)

    async def _delivering(self, running: _Running) -> None:
        while True:
            await _wait(running.send, self.config.delivery_poll_s)
            running.send.clear()
            try:
                while await running.deliverer.deliver_once():
                    pass
            except Exception:
                log.exception("sending the alerts' webhooks failed")
                await asyncio.sleep(self.config.delivery_poll_s)
