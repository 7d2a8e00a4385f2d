"""Step timing: CUDA events on the GPU, resolved lazily; the host clock on CPU.

Events are recorded at each step's begin and end. They are only ever *queried*, never waited
on, so timing adds no synchronization. The agent polls only after a log boundary, until the
interval's steps are resolved, so a step's time becomes known up to an interval later (the
lag); every step is reported exactly once, in order.

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


class StepTimer:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self._device = device
        self._pool: list[torch.Event] = []
        self._pending: deque = deque()
        self._open: tuple | None = None
        self.last_ended = 0  # number of the last step that ended

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
                self._pool += [start, end]
            else:
                gpu_s = he - hb
            self._pending.popleft()
            done.append(StepTime(step, gpu_s, hb, he, self.last_ended - step))
        return done

    def drain(self) -> list[StepTime]:
        """At close: wait for the outstanding events (the one place the timer may block)."""
        if self._pending and self._pending[-1][2] is not None:
            self._pending[-1][2].synchronize()
        return self.poll()
