"""The agent: what a trainer calls. Wire it in with four calls::

    agent = Agent(AgentConfig(server="http://127.0.0.1:8000", run_name="sft"), model=spec)
    for batch in loader:
        agent.step_begin()
        agent.observe_batch(cu_seqlens=batch.cu_seqlens, shape=(n_packs, pack_len))
        loss = train_step(batch)
        agent.step_end(loss=loss)          # a device tensor: never read back here
    agent.close()

Non-logging steps cost two CUDA event records, a few list appends and no host synchronization
(cu_seqlens batches need no device op at all). At each log boundary the interval's statistics
are reduced on the device and copied to pinned host memory with one non-blocking copy; the
record is built once that copy's event and the steps' timing events have completed, as seen by
polling on the steps after the boundary, so the trainer never waits for the agent.

A trainer that synchronizes every step (the Hugging Face Trainer checks each micro-batch's loss
for NaN) leaves the GPU idle while its step ends, so work done there lengthens the step. An
integration for such a trainer sets ``defer_boundary``: ``step_end`` then only takes the
interval's host facts, and the reduction runs at ``finish_boundary()``, which the integration
calls when the GPU has work queued (after the next step's first forward).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import statistics
import sys
import time
import urllib.parse
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TextIO

import torch
import torch.distributed as dist

from packscope.agent import batch_forms, lifecycle, payload
from packscope.agent.accumulator import EXPERT_ASSIGNMENTS, IntervalAccumulator, decode, problems
from packscope.agent.audio import AUDIO_BATCH_KEYS, call_of
from packscope.agent.config import DEFAULT_SPOOL_DIR, AgentConfig
from packscope.agent.gpu_idle import attribute_idle
from packscope.agent.hardware import describe
from packscope.agent.routing import RoutingCounter
from packscope.agent.sender import Sender
from packscope.agent.syncs import SyncCounter
from packscope.agent.timing import StepTime, StepTimer
from packscope.agent.vision import BATCH_KEYS
from packscope.core.attention import SUM_NAMES as ATTENTION_SUM_NAMES
from packscope.core.audio_sums import AUDIO_RECORD_SUMS
from packscope.core.catalogue import wire_record
from packscope.core.flops import ModelSpec, flops_triad_by_kind
from packscope.core.vision import VISION_SUMS, VISION_TOWERS

log = logging.getLogger("packscope.agent")
AUDIO_KEYS = frozenset(key for keys in AUDIO_BATCH_KEYS.values() for key in keys)  # observe_batch's audio arguments
TOP_SYNC_SITES = 20
LAYOUT_TEXT = {
    "bshd": "padded rows (bshd)",
    "thd": "packed documents (thd)",
    "thd-static": "packed documents with static shapes (thd-static)",
    "mixed": "more than one layout (mixed)",
}


def _utc_now() -> str:
    return datetime.now(UTC).isoformat()


def make_run_id(name: str) -> str:
    safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in name)[:32] or "run"
    return f"{safe}-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(3)}"


@dataclass
class _IntervalFacts:
    """What the host knows of an interval when its last step ends (no device value)."""

    index: int
    first_step: int
    last_step: int
    lr: float | None
    syncs: int
    sync_sites: dict[str, int]
    syncs_counted: bool  # False: its syncs were not counted (count_syncs_every, or count_syncs off)
    gpu: dict[str, float] | None  # NVML readings by catalogue field name
    wall_start: float
    wall_end: float
    trace: _Trace | None = None  # its steps CUPTI traced, read back when the interval is emitted


@dataclass
class _Trace:
    """Steps first..last traced through CUPTI's activity API: the host's begin and end of each and
    the sync sites recorded meanwhile, on the tracer's clock."""

    first: int
    last: int
    begins: list[int] = dataclasses.field(default_factory=list)
    ends: list[int] = dataclasses.field(default_factory=list)
    marks: list[tuple[int, str]] = dataclasses.field(default_factory=list)


@dataclass
class _EndedInterval:
    """An ended interval and what its device statistics are reduced from (``Agent._reduce_interval``)."""

    facts: _IntervalFacts
    acc: IntervalAccumulator
    losses: list[torch.Tensor]
    grad_norm: torch.Tensor | None
    channel_sums: list[torch.Tensor]


@dataclass
class _PendingInterval:
    """A reduced interval on its way to the host."""

    facts: _IntervalFacts
    host_counts: list[int]
    buffer: torch.Tensor  # pinned host copy of the packed payload (agent/payload.py)
    layout: payload.Layout
    ready: torch.Event | None  # the copy's completion; None on CPU, where it is synchronous


class Agent:
    def __init__(
        self,
        config: AgentConfig,
        model: ModelSpec,
        device: torch.device | str | None = None,
        dp_group: dist.ProcessGroup | None = None,
    ) -> None:
        self.config = config
        self.model = model
        if device is None:
            device = (
                torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
            )
        self.device = torch.device(device)
        distributed = dist.is_available() and dist.is_initialized()
        self.world_size = dist.get_world_size() if distributed else 1
        self.rank = dist.get_rank() if distributed else 0
        self.dp_size = dist.get_world_size(dp_group) if distributed else 1
        # Every rank sends its own record and the server sums them. Ranks that see the same
        # documents (context/tensor parallel peers of one replica) must not all count them: only
        # the data-parallel group that holds global rank 0 counts, one rank per replica; the others
        # send their timing with zero counts. Known from the group's membership, no collective.
        self.counts_batches = not distributed or dp_group is None or 0 in dist.get_process_group_ranks(dp_group)
        self.run_id = config.run_id or make_run_id(config.run_name)
        if distributed and self.world_size > 1 and config.run_id is None:
            # Every rank must agree on the run id; rank 0's wins.
            box = [self.run_id]
            dist.broadcast_object_list(box, src=0)
            self.run_id = box[0]

        self.step = config.start_step
        self.records: deque[dict] = deque(maxlen=1000)  # recent records, also without a server
        self._routing: RoutingCounter | None = None  # a model with zero-computation experts (count_routing)
        self._acc = self._new_accumulator()
        self._timer = StepTimer(self.device)
        self._times: deque[StepTime] = deque()
        self._inflight: deque[_PendingInterval] = deque()
        self._interval = config.start_step // config.log_every
        self._first_interval = self._interval  # this process's first: sync counting is sampled from it
        self._first_step = config.start_step + 1
        self._last_step = config.start_step + config.log_every  # the interval's boundary step
        self._losses: list[torch.Tensor] = []
        # An integration that keeps its micro-batches' losses by reference, so that a step runs
        # no kernel for them (integrations/losses.py), sets this: the boundary calls it for the
        # interval's mean loss (a device scalar, or None) instead of averaging step_end's losses.
        self.interval_loss: Callable[[], torch.Tensor | None] | None = None
        # An integration that keeps its micro-batches by reference and observes them together
        # (integrations/batches.PendingSteps) sets this: each boundary, and close, calls it
        # first, so every micro-batch of the interval is observed before its counts are reduced.
        self.before_boundary: Callable[[], None] | None = None
        # An integration whose trainer leaves the GPU idle when its steps end sets this and calls
        # finish_boundary() once the GPU has work queued (the module docstring says why).
        self.defer_boundary = False
        self._ended: _EndedInterval | None = None  # ended by step_end, not yet reduced
        self._grad_norm: torch.Tensor | None = None
        self._channel_sums: list[torch.Tensor] = []  # per step: (channels, 2) loss sums and token counts
        self._channel_names: tuple[str, ...] = ()
        self._lr: float | None = None
        self._wall_start: float | None = None
        self._sync_base: tuple[int, dict[str, int]] = (0, {})
        self._closed = False
        self._layouts: set[str] = set()  # the batch layouts seen so far (batch_forms' `kind`)
        self.refused = 0  # intervals not sent: their batch input was inconsistent
        self._terminated = False  # a SIGTERM marked the run failed; the process may still go on

        self.syncs = SyncCounter()
        if config.count_syncs:
            if config.sync_backend == "cupti":
                from packscope.agent.cupti import CuptiSyncCounter

                self.syncs = CuptiSyncCounter()
            self.syncs.install()
        self.syncs.set_counting(self._syncs_counted_in(self._interval))
        # With the CUPTI backend, a few steps of each counted interval traced (docs/ledger.md).
        self._tracer = None
        if (
            config.count_syncs
            and config.sync_backend == "cupti"
            and config.trace_idle_steps
            and self.device.type == "cuda"
        ):
            from packscope.agent.cupti import idle_tracer

            self._tracer = idle_tracer()
        self._trace: _Trace | None = None  # the steps being traced now
        self._done_trace: _Trace | None = None  # traced in the current interval, complete
        self._trace_from: int | None = None  # the step the current interval's trace would begin at
        self._trace_pending = False  # a traced interval not yet emitted: its records are not yet read
        self._tracer_off = False  # CUPTI refused the activity API once: no more traces
        self._plan_trace()

        self.nvml = None
        if config.sample_gpu and self.device.type == "cuda":
            from packscope.agent.nvml import NvmlSampler

            self.nvml = NvmlSampler.try_start(self.device.index or 0)
        self.hardware = describe(self.device, self.world_size, config.peak_tflops)
        self.sender: Sender | None = None
        if config.server or config.spool_dir:  # without a server: offline, into the spool (`packscope sync`)
            self.sender = Sender(self._rank_config(config), self.run_id, self.run_body())
            if config.mark_failed_on_exit:
                lifecycle.watch(self)

    @property
    def run_url(self) -> str | None:
        """The run's dashboard page, when there is a server."""
        if not self.config.server:
            return None
        return f"{self.config.server}/runs/{urllib.parse.quote(self.run_id, safe='')}"

    def announce(self, file: TextIO | None = None) -> None:
        """Print where the run's dashboard is (rank 0, with a server): what `packscope train` and
        the integrations show as the run starts."""
        if self.run_url is not None and self.rank == 0:
            print(f"packscope: run {self.run_id}: {self.run_url}", file=file or sys.stderr, flush=True)

    def _rank_config(self, config: AgentConfig) -> AgentConfig:
        """Rank r > 0 spools under <spool_dir>/rank<r>/, so the ranks of one host never share a
        spool file; rank 0 keeps <spool_dir>/<run_id>.sqlite, the single-process path. Only rank
        0 sends heartbeats: every rank's records are contact too, and a job's ranks live and die
        together."""
        if self.rank == 0:
            return config
        return dataclasses.replace(
            config, spool_dir=os.path.join(config.spool_dir or DEFAULT_SPOOL_DIR, f"rank{self.rank}"), heartbeat_s=0.0
        )

    def run_body(self) -> dict:
        cfg = self.config
        parallel = {"dp": self.dp_size, "tp": 1, "pp": 1, "cp": 1, "ep": 1, **cfg.parallel}
        return {
            "run_id": self.run_id,
            "name": cfg.run_name,
            "project": cfg.project,
            "tags": cfg.tags,
            "config": cfg.config,
            "model": self.model.to_dict(),
            "hardware": self.hardware,
            "parallel": parallel,
            "layout": cfg.layout or "thd",  # what it declares; the batches' own follows (_note_layouts)
            "started_at": _utc_now(),
        }

    # -- the hot path ------------------------------------------------------------------------
    def step_begin(self) -> None:
        if self._terminated:
            self._survived_sigterm()
        self.step += 1
        if self._wall_start is None:
            self._wall_start = time.time()
        if self._trace_from == self.step:
            self._start_trace()
        if self._trace is not None:
            self._trace.begins.append(self._tracer.timestamp())  # type: ignore[union-attr]
        self._timer.begin(self.step)

    def observe_batch(
        self,
        *,
        cu_seqlens: torch.Tensor | Sequence[int] | None = None,
        shape: tuple[int, int] | None = None,
        cu_seqlens_padded: torch.Tensor | Sequence[int] | None = None,
        token_mask: torch.Tensor | None = None,
        position_ids: torch.Tensor | Sequence[Any] | None = None,
        attention_mask: torch.Tensor | Sequence[Any] | None = None,
        packed_seq_params: object | None = None,
        whole_row_attention: bool = False,
        **towers: object,
    ) -> None:
        """Count one micro-batch. Give exactly one form:

        * ``cu_seqlens`` + ``shape=(packs, pack_length)`` [+ ``cu_seqlens_padded``; + ``token_mask``,
          True for real tokens, when static padding or a dummy tail holds padding]
        * ``packed_seq_params`` (anything with Megatron's ``PackedSeqParams`` fields) + ``shape``
          [+ ``token_mask``]: the same as its ``cu_seqlens_q`` / ``cu_seqlens_q_padded``
        * ``position_ids`` (restarting at 0 per document) [+ ``attention_mask`` for padding]
        * ``attention_mask`` alone: BSHD padded rows, one document per row
        * ``shape=(rows, length)`` alone: plain fixed-length BSHD

        Tensors stay where they are; a Python sequence (list, tuple, numpy array) is checked at
        once and copied to the device without blocking. A wrong type, dimension, size or, for a
        sequence, value raises here, naming the argument. The values of a device tensor are
        checked when the interval's counts reach the host (a decreasing or out-of-range
        ``cu_seqlens``): such an interval is not sent, and a warning names it and its steps.

        A vision-language model's images go beside the text form, under its processor's keys:
        ``image_grid_thw`` / ``video_grid_thw`` (Qwen2.5-VL), ``image_sizes`` (Pixtral: Mistral 3,
        Llava), ``pixel_values`` (a fixed-size tower: Gemma 3, Llava's CLIP, Llama 4); mllama's
        ``pixel_values`` with its ``aspect_ratio_mask`` and ``cross_attention_mask`` (both required).
        A model with an audio tower takes the micro-batch's clips, when its tower ran on them, under
        the mask its feature extractor writes: ``feature_attention_mask`` [clips, frames] (or
        ``audio_feature_lengths`` [clips]: Qwen3-Omni), ``input_features_mask`` (Gemma 4, Gemma 3n).

        ``whole_row_attention=True``: the model attends across the packed documents of each row (the
        HF callback's cross-document check found its attention masks let them meet, in this batch
        form; a crossing through a linear-attention layer's state alone is not this), so the per-document
        attention sums count each row as one sequence of its real tokens: the work the model did.
        """
        if towers:
            self._observe_towers(towers)
        if packed_seq_params is not None:
            if cu_seqlens is not None or cu_seqlens_padded is not None:
                raise ValueError("observe_batch: give packed_seq_params or cu_seqlens, not both")
            cu_seqlens, cu_seqlens_padded = batch_forms.cu_seqlens_of_packed_seq_params(packed_seq_params)
            if shape is None:
                raise ValueError("observe_batch(packed_seq_params=...) needs shape=(packs, pack_length)")
        if not self.counts_batches:  # a peer of a rank that counts these documents
            return
        pack_length = self.config.pack_length
        if cu_seqlens is not None:
            if shape is None:
                raise ValueError("observe_batch(cu_seqlens=...) needs shape=(packs, pack_length)")
            cu_batch = batch_forms.from_cu_seqlens(
                cu_seqlens, shape, cu_seqlens_padded, token_mask, device=self.device, pack_length=pack_length
            )
            cu_batch.whole_row = whole_row_attention
            self._acc.add_cu(cu_batch)
            return
        batch: batch_forms.TokenBatch | batch_forms.ShapeBatch
        if position_ids is not None:
            batch = batch_forms.from_position_ids(
                position_ids, attention_mask, device=self.device, pack_length=pack_length
            )
            batch.whole_row = whole_row_attention
        elif attention_mask is not None:
            batch = batch_forms.from_attention_mask(attention_mask, device=self.device)
        elif shape is not None:
            batch = batch_forms.from_shape(shape)
        else:
            raise ValueError("observe_batch needs cu_seqlens, position_ids, attention_mask or shape")
        self._acc.add(batch)

    def _observe_towers(self, towers: dict[str, object]) -> None:
        given = {key: value for key, value in towers.items() if key in AUDIO_KEYS}
        images = {key: value for key, value in towers.items() if key not in AUDIO_KEYS}
        if given:
            self._observe_audio(given)
        if images:
            self._observe_images(images)

    def _observe_audio(self, given: dict[str, object]) -> None:
        audio = self.model.audio
        if audio is None:
            raise ValueError(
                f"observe_batch got {', '.join(sorted(given))} but the model has no audio tower; "
                "read the model from the omni model's config to count it"
            )
        known = AUDIO_BATCH_KEYS[audio.tower]
        unknown = sorted(set(given) - set(known))
        if unknown:
            raise ValueError(
                f"observe_batch: {', '.join(unknown)} is not how a {audio.tower} audio tower's clips come; "
                f"give {' or '.join(known)}"
            )
        clips = call_of(audio, given)
        if clips is not None and self.counts_batches:
            self._acc.add_audio(*clips)

    def _observe_images(self, images: dict[str, object]) -> None:
        vision = self.model.vision
        if vision is None:
            raise ValueError(
                f"observe_batch got {', '.join(sorted(images))} but the model has no vision tower; "
                "read the model from the vision-language config (read_hf_config) to count it"
            )
        known = set(BATCH_KEYS[VISION_TOWERS[vision.tower]])
        unknown = sorted(set(images) - known)
        if unknown:
            raise ValueError(
                f"observe_batch: unknown argument(s) {', '.join(unknown)}; "
                f"a {vision.tower} tower's images come as {', '.join(sorted(known))}"
            )
        if self.counts_batches:
            self._acc.add_vision(images)

    def step_end(
        self,
        loss: torch.Tensor | float | None = None,
        lr: float | None = None,
        grad_norm: torch.Tensor | float | None = None,
        channel_loss: torch.Tensor | None = None,
        channel_names: Sequence[str] | None = None,
    ) -> None:
        """End the step. ``channel_loss`` is a (channels, 2) device tensor of summed loss and
        token count per channel for this step; the record gets each named channel's mean over
        the interval (``channel_names``, given once or every step; default ch0, ch1, ...)."""
        self._timer.end()
        if self._trace is not None:
            self._trace.ends.append(self._tracer.timestamp())  # type: ignore[union-attr]
            if self.step >= self._trace.last:
                self._stop_trace()
        self.finish_boundary()  # at the latest: its kept micro-batches must not meet this step's
        # Device tensors are kept as they are (reading them would synchronize); Python floats
        # become device scalars with fill_, which, unlike torch.tensor(x, device=...), is no copy.
        if loss is not None:
            self._losses.append(self._as_device_scalar(loss))
        if grad_norm is not None:
            self._grad_norm = self._as_device_scalar(grad_norm)
        if lr is not None:
            self._lr = float(lr)
        if channel_loss is not None:
            self._add_channel_loss(channel_loss, channel_names)
        if self.step >= self._last_step:
            self._close_interval()
        if self._inflight and self._poll():  # between boundaries there is nothing to poll for
            self._timer.agent_worked()  # the emission ran before the next step's begin

    def _add_channel_loss(self, sums: torch.Tensor, names: Sequence[str] | None) -> None:
        """Keep a reference (no kernel, no read); the interval sums them at its boundary."""
        if sums.dim() != 2 or sums.shape[1] != 2:
            raise ValueError(f"channel_loss must be (channels, 2) summed loss and token count, got {tuple(sums.shape)}")
        if names is not None:
            self._channel_names = tuple(names)
        elif not self._channel_names:
            self._channel_names = tuple(f"ch{i}" for i in range(sums.shape[0]))
        if len(self._channel_names) != sums.shape[0]:
            raise ValueError(f"channel_loss has {sums.shape[0]} channels but {len(self._channel_names)} names")
        self._channel_sums.append(sums.detach())

    def _as_device_scalar(self, value: torch.Tensor | float) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            return value.detach() if value.requires_grad else value
        return torch.empty((), dtype=torch.float64, device=self.device).fill_(float(value))

    # -- log boundary: each step of an interval's life has its own function ------------------
    def _close_interval(self) -> None:
        """End the interval and start its trip to the host without waiting for it; with
        ``defer_boundary``, the trip starts at finish_boundary()."""
        ended = self._end_interval()
        if self.defer_boundary:
            self._ended = ended
        else:
            self._reduce_interval(ended)

    @property
    def boundary_waiting(self) -> bool:
        """An interval has ended and waits for finish_boundary (only with ``defer_boundary``)."""
        return self._ended is not None

    def finish_boundary(self) -> None:
        """Reduce the interval that the last boundary ended, if it is still waiting (only with
        ``defer_boundary``): the launches of its reduction and copy, no wait. Call it when the
        GPU has work queued; step_end and close call it too, at the latest."""
        ended, self._ended = self._ended, None
        if ended is not None:
            self._reduce_interval(ended)

    # -- traced steps (docs/ledger.md): host calls on a few steps of a counted interval only ----
    def _plan_trace(self) -> None:
        """The step the opening interval's trace begins at: its second (its first follows the
        agent's own boundary work), where its syncs are counted and no earlier trace is unread."""
        counted = self.syncs.counting and self.syncs.installed and not self._tracer_off
        self._trace_from = self._first_step + 1 if self._tracer is not None and counted else None

    def _start_trace(self) -> None:
        if self._trace_pending:  # the last trace is not read yet: its records and these would mix
            return
        last = min(self.step + self.config.trace_idle_steps - 1, self._last_step)
        try:
            self._tracer.start()  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - a profiler's failure must not stop training
            self._tracing_failed("start", exc)
            return
        self._trace = _Trace(self.step, last)
        self.syncs.clock = self._tracer.timestamp  # type: ignore[union-attr]
        self.syncs.marks = self._trace.marks

    def _stop_trace(self) -> None:
        self.syncs.marks = None
        self._done_trace, self._trace = self._trace, None
        self._trace_pending = True
        try:
            self._tracer.stop()  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001
            self._tracing_failed("stop", exc)

    def _tracing_failed(self, what: str, exc: Exception) -> None:
        """CUPTI refused the activity API: no more traces in this run (their terms: not measured)."""
        log.warning("packscope: CUPTI's activity tracing failed to %s (%s); the ledger's sync and launch-bound "
                    "terms will not be measured for this run", what, exc)  # fmt: skip
        self._trace_from = None
        self._done_trace = self._trace = None
        self._tracer_off = True

    def _take_traced(self) -> tuple[list, list] | None:
        """The records CUPTI has delivered since the last take; None where it refused the flush."""
        try:
            if not self.syncs.installed:  # closed: the subscription's last flush delivered them
                return self._tracer.delivered()  # type: ignore[union-attr]
            return self._tracer.take()  # type: ignore[union-attr]
        except Exception as exc:  # noqa: BLE001 - a profiler's failure must not stop training
            log.warning("packscope: CUPTI's activity records could not be read (%s); traced steps not sent", exc)
            return None

    def _traced_fields(self, trace: _Trace, steps: list[StepTime]) -> dict[str, Any]:
        """The traced steps' time, busy and idle (agent/gpu_idle.py), from the records CUPTI has
        delivered: their steps' events have completed, so their GPU work has."""
        taken = self._take_traced()
        self._trace_pending = False
        if taken is None:
            return {}
        busy, host_syncs = taken
        traced = [s for s in steps if trace.first <= s.step <= trace.last]
        # The gap before traced step first + k + 1 is the trace's gap k; the agent's own work in
        # it (an emission) is not the trainer's, as the data wait leaves it out.
        agent_gaps = {s.step - trace.first - 1 for s in traced if s.agent_gap and s.step > trace.first}
        spans = list(zip(trace.begins, trace.ends, strict=True))
        split = attribute_idle(busy, host_syncs, trace.marks, spans, agent_gaps=agent_gaps)
        return {
            "traced_steps": len(traced),
            "traced_step_time_s": sum(s.gpu_s for s in traced),
            "traced_busy_s": split.busy_s,
            "sync_idle_s": split.sync_idle_s,
            "launch_idle_s": split.launch_idle_s,
            "traced_gaps": split.traced_gaps,
            "sync_idle_between_s": split.sync_idle_between_s,
            "sync_blocked_s": split.blocked_s,
            "sync_blocked_between_s": split.blocked_between_s,
            "sync_loop_idle_s": split.loop_idle_s,
            "sync_loop_blocked_s": split.loop_blocked_s,
        }

    def count_routing(self, model: torch.nn.Module) -> None:
        """Count the routing of a model with zero-computation experts (``ModelSpec.routing_dependent``,
        LongCat-Flash) on the device, for its routed experts' work: hooks on ``model``'s routers
        (agent/routing.py). The HF callback calls it; a trainer of its own calls it once, before
        training, with the model it trains."""
        if not self.model.routing_dependent:
            raise ValueError(f"{self.model.name or 'the model'} has no zero-computation experts: no routing to count")
        if self._routing is None:
            self._routing = RoutingCounter(model)

    def _take_routing(self) -> None:
        """The assignments the routers made in the ending interval, to its accumulator (a host swap)."""
        if not self.model.routing_dependent:
            return
        if self._routing is None:
            raise ValueError(
                f"{self.model.name or 'the model'} routes tokens to zero-computation experts, so its FLOPs need the "
                "routing: call Agent.count_routing(model) before training (the HF callback does)"
            )
        taken = self._routing.take()
        if taken is not None and self.counts_batches:  # one rank per replica counts its tokens, as its batches
            self._acc.add_device_sum(EXPERT_ASSIGNMENTS, taken)

    def _end_interval(self) -> _EndedInterval:
        """The interval's host facts as of its last step (no device op), then the next one opens."""
        self._take_routing()
        syncs, sites = self._sync_delta()
        if self._trace is not None:  # cut short (close): its records are dropped unread
            self._stop_trace()
            self._done_trace, self._trace_pending = None, False
            self._take_traced()
        trace, self._done_trace = self._done_trace, None
        facts = _IntervalFacts(
            index=self._interval, first_step=self._first_step, last_step=self.step, lr=self._lr,
            syncs=syncs, sync_sites=sites, syncs_counted=self.syncs.counting,
            gpu=self.nvml.take() if self.nvml else None,
            wall_start=self._wall_start or time.time(), wall_end=time.time(), trace=trace,
        )  # fmt: skip
        ended = _EndedInterval(facts, self._acc, self._losses, self._grad_norm, self._channel_sums)
        self._open_next_interval()
        return ended

    def _reduce_interval(self, ended: _EndedInterval) -> None:
        """Its device statistics reduced, packed and copied to pinned memory without blocking."""
        if self.before_boundary is not None:
            # The integration's kept micro-batches are the ended interval's: count them there.
            current, self._acc = self._acc, ended.acc
            try:
                self.before_boundary()
            finally:
                self._acc = current
        counts, host_counts = ended.acc.reduce(self.device), ended.acc.host.as_list()
        self._note_layouts(ended.acc.kinds)
        packed, layout = payload.pack(counts, self._interval_floats(ended), self.device)
        buffer, ready = self._copy_to_host(packed)
        self._inflight.append(_PendingInterval(ended.facts, host_counts, buffer, layout, ready))

    def _interval_floats(self, ended: _EndedInterval) -> dict[str, torch.Tensor]:
        floats = {}
        loss = self.interval_loss() if self.interval_loss is not None else None
        if loss is not None:
            floats["loss"] = loss
        elif ended.losses:
            floats["loss"] = self._mean_loss(ended.losses)
        if ended.grad_norm is not None:
            floats["grad_norm"] = ended.grad_norm
        if ended.channel_sums:
            sums = [s.to(self.device, torch.float64) for s in ended.channel_sums]
            floats["channel_loss"] = torch.stack(sums).sum(0)
        return floats

    def _mean_loss(self, losses: list[torch.Tensor]) -> torch.Tensor:
        if all(loss.device == self.device and loss.dim() == 0 for loss in losses):
            return torch.stack(losses).to(torch.float64).mean()  # three kernels, whatever the count
        return torch.stack([loss.reshape(()).to(self.device, torch.float64) for loss in losses]).mean()

    def _copy_to_host(self, packed: torch.Tensor) -> tuple[torch.Tensor, torch.Event | None]:
        """One non-blocking copy into pinned memory and an event that tells when it has landed."""
        buffer = torch.empty(packed.shape, dtype=torch.int64, pin_memory=self.device.type == "cuda")
        buffer.copy_(packed, non_blocking=True)
        if self.device.type != "cuda":
            return buffer, None
        ready = torch.Event(self.device)
        ready.record()
        return buffer, ready

    def _sync_delta(self) -> tuple[int, dict[str, int]]:
        """Host syncs counted since the last boundary, in total and by site."""
        total, sites = self.syncs.snapshot()
        base_total, base_sites = self._sync_base
        self._sync_base = (total, sites)
        delta = {site: n - base_sites.get(site, 0) for site, n in sites.items() if n > base_sites.get(site, 0)}
        return total - base_total, delta

    def _syncs_counted_in(self, interval: int) -> bool:
        """Whether an interval's host syncs are counted: with count_syncs, the process's first two
        (warm-up, then the first steady one), then one in count_syncs_every, the same on every rank."""
        n = interval - self._first_interval
        return self.config.count_syncs and (n < 2 or (n - 1) % self.config.count_syncs_every == 0)

    def _new_accumulator(self) -> IntervalAccumulator:
        model = self.model
        return IntervalAccumulator(window=model.window, chunk=model.chunk, vision=model.vision, audio=model.audio)

    def _open_next_interval(self) -> None:
        self._interval += 1
        self.syncs.set_counting(self._syncs_counted_in(self._interval))  # host flags only: no device op
        self._first_step = self.step + 1
        self._last_step = self.step + self.config.log_every
        self._plan_trace()
        self._acc = self._new_accumulator()  # the ended interval keeps its own until reduced
        self._losses = []
        self._grad_norm = None
        self._channel_sums = []
        self._wall_start = None

    def _poll(self) -> int:
        """Emit the intervals whose steps and copies have completed; how many."""
        self._times.extend(self._timer.poll())
        emitted = 0
        while self._inflight:
            p = self._inflight[0]
            timed = self._times and self._times[-1].step >= p.facts.last_step
            if not timed or (p.ready is not None and not p.ready.query()):
                break
            self._inflight.popleft()
            self._emit(p)
            emitted += 1
        return emitted

    def _emit(self, p: _PendingInterval) -> None:
        steps = [self._times.popleft() for _ in range(p.facts.last_step - p.facts.first_step + 1)]
        counts, floats = payload.unpack(p.buffer, p.layout)  # host memory, already complete
        record = self._record(p.facts, steps, decode(counts, p.host_counts), floats)
        found = problems(counts)
        if found:
            self._refuse(record, found)
            return
        self.records.append(record)
        if self.sender is not None:
            self.sender.submit(record)

    def _refuse(self, record: dict, found: dict[str, int]) -> None:
        """An interval whose batch input was inconsistent: its counts are wrong, so it is not sent.
        The server is told it was refused and why (the run page says so instead of staying empty);
        the first one is logged as a warning, later ones now and then with a running count."""
        reason = "; ".join(f"{batch_forms.PROBLEM_TEXT[name]} at {n} entries" for name, n in found.items())
        self.refused += 1
        record["refused"] = reason
        self.records.append(record)
        steps = f"steps {record['first_step']}-{record['last_step']}"
        if self.refused == 1 or self.refused % 100 == 0:
            log.warning(
                "packscope: interval %d (%s) not sent: %s. Its counts would be wrong; check the cu_seqlens "
                "passed to observe_batch (%d intervals refused so far)",
                record["interval"],
                steps,
                reason,
                self.refused,
            )
        if self.sender is not None:
            keys = {k: record[k] for k in ("interval", "rank", "first_step", "last_step")}
            self.sender.contact.refuse({**keys, "by": "agent", "reason": reason})

    def _note_layouts(self, kinds: set[str]) -> None:
        """The run's layout, from its batches: told to the server when first known and whenever it
        changes, with a warning when it differs from the declared one."""
        if not kinds or kinds <= self._layouts:
            return
        before = self.layout_seen
        self._layouts |= kinds
        seen = self.layout_seen
        if seen is None or seen == before:
            return
        declared = self.config.layout
        if declared is not None and seen.split("-")[0] != declared and (before or declared).split("-")[0] == declared:
            log.warning(
                "packscope: run %s was declared layout %r, but its batches are %s; it is shown as %r",
                self.run_id,
                declared,
                LAYOUT_TEXT[seen],
                seen,
            )
        if self.sender is not None and self.rank == 0:
            fields: dict[str, Any] = {"layout": seen}
            if self.config.pack_length is not None and before is None:
                fields["pack_length"] = self.config.pack_length
                fields["pack_length_from"] = self.config.pack_length_from or "AgentConfig.pack_length"
            self.sender.contact.update(**fields)

    def tell_cross_documents(self, found: str, detail: str) -> None:
        """What a cross-document check found (kept, crossed, not checked; integrations/
        cross_documents.py), for the run page: rank 0 sends it with the layout's PATCH."""
        if self.sender is not None and self.rank == 0:
            self.sender.contact.update(cross_documents=found, cross_documents_detail=detail[:300])

    @property
    def layout_seen(self) -> str | None:
        """The layout of the batches so far: bshd, thd, thd-static, mixed; None before any."""
        if not self._layouts:
            return None
        return next(iter(self._layouts)) if len(self._layouts) == 1 else "mixed"

    # -- process end -------------------------------------------------------------------------
    def terminated(self) -> None:
        """SIGTERM (agent/lifecycle.py): mark the run failed now, with one short request."""
        if self._closed or self.sender is None or self.config.server is None:
            return
        self._terminated = True
        lifecycle.send_status(self.config.server, self.run_id, "failed", self.config.token)

    def _survived_sigterm(self) -> None:
        """The trainer's own SIGTERM handler let the process go on: the run is running after all."""
        self._terminated = False
        if self.sender is not None:
            self.sender.contact.update(status="running")

    def _record(self, p: _IntervalFacts, steps: list[StepTime], stats: dict, floats: dict[str, Any]) -> dict:
        """The wire record (docs/wire.md): the catalogue's fields at their wire paths
        (catalogue.wire_record), then its other parts: the sync sites, the histograms and the
        channels' losses. `stats` holds the interval's counts by field name (accumulator.decode)."""
        durations = sorted(s.gpu_s for s in steps)
        n = len(steps)
        # The host's time between steps: the gaps between the interval's steps. The one before
        # its first step holds the agent's own boundary work (the reduction, its copy), and a gap
        # where the agent emitted an interval holds the emission (the trace's read-back and
        # pricing): both are the agent's, so they are left out.
        gaps = [s.gap_before_s for s in steps[1:] if s.gap_before_s is not None and not s.agent_gap]
        traced = self._traced_fields(p.trace, steps) if p.trace is not None else {}
        top = sorted(p.sync_sites.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_SYNC_SITES]
        sums = {name: stats[name] for name in ATTENTION_SUM_NAMES}
        if self.model.routing_dependent:  # the routed experts at the assignments counted, in every view
            flops = flops_triad_by_kind(
                stats["tokens"], stats["real_tokens"], sums, self.model.c_lin_fixed, self.model.c_core_by_sum
            )
            routed = self.model.c_assignment * stats[EXPERT_ASSIGNMENTS]
            flops = {view: value + routed for view, value in flops.items()}
        else:  # the field is for such a model alone
            stats = {name: value for name, value in stats.items() if name != EXPERT_ASSIGNMENTS}
            flops = self.model.triad_by_kind(stats["tokens"], stats["real_tokens"], sums)
        if self.model.vision is not None:  # the tower's work, the same in every view
            tower = self.model.vision.flops({name: stats[name] for name in VISION_SUMS})
            flops = {view: value + tower for view, value in flops.items()}
        if self.model.audio is not None:  # likewise
            tower = self.model.audio.flops({name: stats[name] for name in AUDIO_RECORD_SUMS})
            flops = {view: value + tower for view, value in flops.items()}
        record = wire_record({
            "interval": p.index, "rank": self.rank,
            "first_step": p.first_step, "last_step": p.last_step, "steps": n, "gpus": 1,
            "wall_start": p.wall_start, "wall_end": p.wall_end,
            "gpu_time_s": sum(durations),
            "host_time_s": steps[-1].host_end - steps[0].host_begin,
            "step_time_p50_s": statistics.median(durations),
            "step_time_p90_s": durations[min(n - 1, int(0.9 * n))],
            "step_time_max_s": durations[-1],
            "timing_lag_steps": max(s.lag_steps for s in steps),
            **{name: value for name, value in stats.items() if name != "histograms"},
            **{f"flops_{kind}": float(value) for kind, value in flops.items()},
            "syncs_total": p.syncs, "syncs_uncounted_steps": 0 if p.syncs_counted else n,
            "data_wait_s": sum(gaps), "data_wait_gaps": len(gaps), **traced,
            "loss": floats.get("loss"), "lr": p.lr, "grad_norm": floats.get("grad_norm"),
            **(p.gpu or {}),
        })  # fmt: skip
        record["syncs"]["sites"] = [{"site": s, "count": c} for s, c in top]
        record["histograms"] = stats["histograms"]
        record.update(self._channel_loss_field(floats))
        return record

    def _channel_loss_field(self, floats: dict) -> dict:
        """``channel_loss`` {name: mean loss} and ``channel_tokens`` {name: tokens} over the
        channels that had tokens, if any were sent: the counts make the means addable."""
        if "channel_loss" not in floats:
            return {}
        sums = [
            (name, total, count)
            for name, (total, count) in zip(self._channel_names, floats["channel_loss"], strict=False)
            if count
        ]
        return {
            "channel_loss": {name: total / count for name, total, count in sums},
            "channel_tokens": {name: round(count) for name, _, count in sums},
        }

    # -- shutdown ----------------------------------------------------------------------------
    def close(self, status: str = "finished", timeout_s: float = 30.0) -> bool:
        """Flush the last partial interval, wait for outstanding copies, send, set the status.

        Returns True when every record reached the server (or there is no server).
        """
        if self._closed:
            return True
        self._closed = True
        lifecycle.forget(self)
        self.syncs.uninstall()  # the waits below are ours, not the trainer's
        if self.nvml is not None:
            self.nvml.close()
        self.finish_boundary()
        if self.step >= self._first_step:
            self._reduce_interval(self._end_interval())
        self._times.extend(self._timer.drain())
        for p in list(self._inflight):
            if p.ready is not None:
                p.ready.synchronize()
        self._poll()
        if self.refused:
            log.warning("packscope: %d intervals of run %s not sent (bad batch input)", self.refused, self.run_id)
        if self.sender is None:
            return True
        # Rank 0 sets the run's final status; another rank only reports its own failure.
        patch = {"status": status, "ended_at": _utc_now()} if self.rank == 0 or status == "failed" else None
        ok = self.sender.close(patch, timeout_s)
        if not ok:
            log.warning(
                "packscope: not every record reached %s; see the spool at %s",
                self.config.server,
                self.sender.spool.path,
            )
        return ok

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close("failed" if exc_type else "finished")
