"""Step timing: CUDA events on the GPU, resolved lazily; the host clock on CPU.

Events are recorded at each step's begin and end. They are only ever *queried*, never waited
on, so timing adds no synchronization. The agent polls only after a log boundary, until the
interval's steps are resolved, so a step's time becomes known up to an interval later (the
lag); every step is reported exactly once, in order.

The gap before a step (the previous step's end event to this step's begin event) is the GPU's
idle time between the two: when the host records the begin while the GPU still has the previous
step's work queued, the begin runs right after the end and the gap is ~0; when the host comes
late (waiting for its next batch), the GPU idles until the begin runs. The previous step's end
event is kept until the next step resolves, so the gap is read like the step times: by query.
On the CPU the host clock's gap between the two calls is the analogue.

A gap is the host's time outside the step, whoever spent it. The agent marks the gaps in which
it did its own work (``agent_worked``: an interval emitted, whose CUPTI trace it reads back and
prices, hundreds of ms on a traced interval), so that they are not taken for the trainer's.

The events are ``torch.Event``, whose ``record()`` finds the current stream in C++; the
``torch.cuda.Event`` wrapper builds a Python ``Stream`` object on every record, which is most of
the timer's host cost on a slow host.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import torch


@dataclass
class StepTime:
    step: int
    gpu_s: float  # event-timed on CUDA, host clock on CPU
    host_begin: float  # perf_counter at step_begin
    host_end: float  # perf_counter at step_end
    lag_steps: int  # how many later steps had ended when this one's time became known
    gap_before_s: float | None = None  # idle time since the previous step's end; None for a first step
    agent_gap: bool = False  # the agent did its own work in that gap (agent_worked)


class StepTimer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._device = device
        self._pool: list[torch.Event] = []
        self._pending: deque = deque()
        self._open: tuple | None = None
        self.last_ended = 0  # number of the last step that ended
        # The last resolved step: its number, end event (kept for the next step's gap) and host end.
        self._previous: tuple[int, torch.Event | None, float] | None = None
        self._agent_after: set[int] = set()  # steps after whose end the agent did its own work

    def _event(self) -> torch.Event:
        return self._pool.pop() if self._pool else torch.Event(self._device, enable_timing=True)

    def begin(self, step: int) -> None:
        start = None
        if self.cuda:
            start = self._event()
            start.record()
        self._open = (step, start, time.perf_counter())

    def end(self) -> None:
        if self._open is None:
            raise RuntimeError("step_end() without step_begin()")
        step, start, host_begin = self._open
        self._open = None
        end = None
        if self.cuda:
            end = self._event()
            end.record()
        self._pending.append((step, start, end, host_begin, time.perf_counter()))
        self.last_ended = step

    def agent_worked(self) -> None:
        """The agent did its own work after the last step's end (before the next begin): that
        gap is the agent's, not the trainer's."""
        self._agent_after.add(self.last_ended)

    def poll(self) -> list[StepTime]:
        """Steps whose timing is known now, oldest first. Never blocks."""
        done = []
        while self._pending:
            step, start, end, hb, he = self._pending[0]
            if end is not None:
                # The start is checked too: a trainer may switch streams between the two.
                if not (end.query() and start.query()):
                    break
                gpu_s = start.elapsed_time(end) / 1e3
            else:
                gpu_s = he - hb
            self._pending.popleft()
            gap = self._gap_before(step, start, hb)
            if start is not None:
                self._pool.append(start)
            self._previous = (step, end, he)
            agents = step - 1 in self._agent_after
            self._agent_after.discard(step - 1)
            done.append(StepTime(step, gpu_s, hb, he, self.last_ended - step, gap, agents))
        return done

    def _gap_before(self, step: int, start: torch.Event | None, host_begin: float) -> float | None:
        """The idle time from the previous step's end to this step's begin, both completed (None
        where the previous step resolved is not the one before); the previous end goes back to
        the pool."""
        if self._previous is None:
            return None
        number, end, host_end = self._previous
        gap = None
        if number == step - 1:
            if end is not None and start is not None:
                gap = max(0.0, end.elapsed_time(start) / 1e3)  # 0 where another stream ordered them otherwise
            elif end is None:
                gap = max(0.0, host_begin - host_end)
        if end is not None:
            self._pool.append(end)
        self._previous = None
        return gap

    def drain(self) -> list[StepTime]:
        """At close: wait for the outstanding events (the one place the timer may block)."""
        if self._pending and self._pending[-1][2] is not None:
            self._pending[-1][2].synchronize()
        return self.poll()
