"""The catalogue: every interval field and every derived metric, defined once.

* ``FIELDS`` — the scalar quantities of one interval record, as the agent sends them (``wire``,
  a dotted path where the record nests them), as the server stores them (``name``, one column
  each) and as the CSV export lists them. The server's validation schema and table columns are
  generated from this list.
* ``SUMS`` — the additive sums over a set of intervals (a chart bucket, a rollup, a run, one
  CSV row) that every derived number is computed from. Sums add across ranks and intervals, so
  a rollup of sums is exact.
* ``METRICS`` — every number the dashboard and the API show, with its label, unit, display
  format and its derivation from SUMS; ``derive`` is the one implementation of those formulas.

Nothing here imports torch or the server's libraries; the pages fetch this catalogue as JSON
(``GET /api/v1/catalogue``) for their labels, units and formats.
"""

from __future__ import annotations

import functools
import json
import math
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from types import MappingProxyType
from typing import Any, Literal, Protocol

from packscope.core.attention import ATTENTION_KINDS, ATTENTION_SUMS, CHUNKED, FULL, SLIDING, VIEWS
from packscope.core.audio_sums import AUDIO_RECORD_SUMS, c_totals
from packscope.core.flops import TRIAD, ModelSpec, flops_by_kind
from packscope.core.vision import (
    CROSS_PAIRS,
    CROSS_TEXT_TOKENS,
    VISION_IMAGES,
    VISION_PATCHES,
    VISION_SQ_SUM,
    VISION_SUMS,
    VISION_WINDOW_SQ_SUM,
)

INT64_MAX = 2**63 - 1
INT32_MAX = 2**31 - 1
# Floats must be finite and small enough that a sum of a million of them stays finite, and 0 or
# large enough that PostgreSQL's float8 arithmetic on them (which raises where a result underflows
# to 0) does not fail: a stored value is 0 or of a magnitude in [FLOAT_MIN, FLOAT_MAX].
FLOAT_MAX = 1e300
FLOAT_MIN = 1e-300
# The shape of a batch and its non-scalar parts (docs/wire.md): what a sender may send at once,
# and what the server stores of the sync sites and channels.
MAX_BATCH = 1000  # interval records per request
MAX_SYNC_SITES = 100  # sync sites per record
MAX_SITE_LENGTH = 500  # characters of a sync site
MAX_CHANNEL_NAME = 100  # characters of a channel name

Kind = Literal["int", "float"]


@dataclass(frozen=True)
class Field:
    """One scalar quantity of an interval record."""

    name: str  # the column and CSV name
    kind: Kind
    unit: str
    doc: str
    wire: str = ""  # dotted path in the wire record when it differs from ``name``
    required: bool = True
    minimum: float | None = 0
    maximum: float | None = None
    small: bool = False  # fits int32 (indexes, ranks)
    # What a record without the field holds (a field added after agents that do not send it), or
    # None: the field is then required (or, not required, missing: NULL).
    default: int | float | None = None

    @cached_property
    def wire_path(self) -> tuple[str, ...]:
        """Split once per field: an agent builds a wire record at every interval boundary, on the
        training thread."""
        return tuple((self.wire or self.name).split("."))

    @property
    def upper(self) -> float:
        if self.maximum is not None:
            return self.maximum
        if self.kind == "float":
            return FLOAT_MAX
        return INT32_MAX if self.small else INT64_MAX


def _int(name: str, unit: str, doc: str, **kw: Any) -> Field:
    return Field(name, "int", unit, doc, **kw)


def _float(name: str, unit: str, doc: str, **kw: Any) -> Field:
    return Field(name, "float", unit, doc, **kw)


def _seconds(name: str, doc: str, **kw: Any) -> Field:
    return Field(name, "float", "s", doc, **kw)


# Each layer kind's two attention sums, under the names packscope.core.attention gives them: the
# baseline's, then the real documents' (Σ s_i²). Full attention's came with the first agent; the
# other kinds' are 0 in a record without them (a model without such layers).
_ATTENTION_DOCS = {
    FULL: ("S2 of the baseline: every pack one dense sequence", "S2 over the real documents"),
    SLIDING: (
        "sliding-window attention sum of the baseline (s² to W, then 2sW − W²)",
        "sliding-window attention sum over the real documents",
    ),
    CHUNKED: (
        "chunked attention sum of the baseline (Σ over chunks of c²)",
        "chunked attention sum over the real documents",
    ),
}


def _attention_fields() -> Iterator[Field]:
    for kind, names in ATTENTION_SUMS.items():
        baseline, real = _ATTENTION_DOCS[kind]
        default = None if kind == FULL else 0
        yield _int(names.bshd, "tokens²", baseline, default=default)
        yield _int(names.thd, "tokens²", real, default=default)


# A vision-language model's tower, over the micro-batches' images, under the names
# packscope.core.vision gives its sums: the same whether the decoder's rows are packed or not (the
# tower attends within each image); 0 in a record of a text model.
_VISION_DOCS = {
    VISION_IMAGES: ("images", "images (frames, tiles) the vision tower encoded"),
    VISION_PATCHES: ("patches", "vision patches encoded (Σ p_i)"),
    VISION_SQ_SUM: ("patches²", "Σ p_i² over the images: the tower's full-attention blocks"),
    VISION_WINDOW_SQ_SUM: ("patches²", "Σ over windows of w²: the tower's windowed blocks"),
    CROSS_TEXT_TOKENS: ("tokens", "mllama: text tokens of micro-batches with images (its cross-attention layers')"),
    CROSS_PAIRS: ("pairs", "mllama: (text token, image token) pairs its cross-attention masks admit"),
}


def _vision_fields() -> Iterator[Field]:
    for name in VISION_SUMS:
        unit, doc = _VISION_DOCS[name]
        yield _int(name, unit, doc, default=0)


# A model's audio tower (Qwen3-Omni's thinker, Gemma 4), over the micro-batches' clips, under the
# names packscope.core.audio_sums gives the towers' sums (each tower fills its own, the others 0):
# the same whether the decoder's rows are packed or not; 0 in a record of a model without one.
_AUDIO_DOCS = {
    "audio_clips": ("clips", "audio clips the audio tower encoded"),
    "audio_chunks": ("chunks", "Qwen3-Omni: conv chunks of the clips (Σ K)"),
    "audio_conv1_frames": ("frames", "time positions out of the first convolution, padding included"),
    "audio_conv2_frames": ("frames", "Qwen3-Omni: time positions out of the second convolution (Σ K · g²(L))"),
    "audio_conv3_frames": ("frames", "Qwen3-Omni: time positions out of the third convolution (Σ K · g³(L))"),
    "audio_tokens": ("tokens", "audio tokens the tower hands the decoder"),
    "audio_sq_sum": ("tokens²", "Qwen3-Omni: Σ over attention windows of w²"),
    "audio_calls": ("calls", "Gemma 4, Gemma 3n: calls of the audio tower (micro-batches with clips)"),
    "audio_positions": ("positions", "Gemma 4, Gemma 3n: the tower's positions, padding included (Σ B · g²(T))"),
    "audio_blocks": ("blocks", "Gemma 4, Gemma 3n: attention blocks (Σ B · ⌈g²(T) / chunk⌉)"),
}


def _audio_fields() -> Iterator[Field]:
    for name in AUDIO_RECORD_SUMS:
        unit, doc = _AUDIO_DOCS[name]
        yield _int(name, unit, doc, default=0)


FIELDS: tuple[Field, ...] = (
    # Which interval of the run, and its span of steps.
    _int("interval", "", "interval index; (run, rank, interval) is the idempotency key", small=True),
    _int("rank", "", "the sending rank", small=True),
    _int("first_step", "step", "first optimizer step of the interval"),
    _int("last_step", "step", "last optimizer step of the interval"),
    _int("steps", "steps", "steps measured in the interval", minimum=1, small=True),
    _int("gpus", "GPUs", "GPUs whose work the sums cover", minimum=1, small=True),
    # Its time: the wall clock, the device's (the steps' CUDA events) and the host's.
    _seconds("wall_start", "unix time of the first step's begin", minimum=None),
    _seconds("wall_end", "unix time of the last step's end", minimum=None),
    _seconds("gpu_time_s", "sum of the steps' event-timed durations"),
    _seconds("host_time_s", "host clock from the first step's begin to the last step's end"),
    # How the steps' times spread, and how late their events were read.
    _seconds("step_time_p50_s", "median step time"),
    _seconds("step_time_p90_s", "90th percentile step time"),
    _seconds("step_time_max_s", "slowest step"),
    _int("timing_lag_steps", "steps", "how many steps later the event timing resolved", small=True),
    # What the steps ran: tokens, documents and the attention sums of both views.
    _int("tokens", "tokens", "token slots the model ran, padding included (T)"),
    _int("real_tokens", "tokens", "tokens of real documents"),
    _int("packs", "packs", "packs (THD) or rows (BSHD)"),
    _int("documents", "documents", "real documents"),
    *_attention_fields(),
    *_vision_fields(),
    # A model with zero-computation experts (LongCat-Flash, ModelSpec.routing_dependent): its routed
    # experts' work is the router's choice, so the agent counts it; any other model's record lacks it.
    _int(
        "expert_assignments",
        "assignments",
        "(token, top-k slot) assignments to real experts over the MoE layers, zero-computation experts' left out",
        required=False,
    ),
    *_audio_fields(),
    _float("flops_bshd", "FLOP", "the agent's baseline FLOPs (kept for audit; rates are re-derived)"),
    _float("flops_thd", "FLOP", "the agent's THD-corrected FLOPs (kept for audit)"),
    _float("flops_useful", "FLOP", "the agent's useful FLOPs (kept for audit)"),
    _int("syncs_total", "syncs", "host synchronizations counted in the interval", wire="syncs.total"),
    # The agent counts syncs over one interval in a few (AgentConfig.count_syncs_every): a counted
    # sync costs the trainer tens of µs in PyTorch's warning path. Σ syncs ÷ (Σ steps - Σ these).
    _int(
        "syncs_uncounted_steps",
        "steps",
        "steps of the interval whose syncs were not counted (0: all counted)",
        wire="syncs.uncounted_steps",
        small=True,
        default=0,
    ),
    # The ledger's time measurements (docs/ledger.md); a record without them (an older agent) holds
    # NULL: "not measured". Data wait: the GPU's idle time between consecutive steps of the interval
    # (a step's end event to the next step's begin event; the host clock on the CPU), the gap after
    # the previous interval's boundary step left out (the agent's own work runs there).
    _seconds("data_wait_s", "GPU idle time between the interval's consecutive steps", required=False),
    _int("data_wait_gaps", "gaps", "the step gaps data_wait_s sums (the interval's steps - 1)", required=False),
    # A few steps of a sampled interval traced by CUPTI's activity API (with the cupti sync backend):
    # their event-timed time, the GPU's busy time in them and its idle time inside them, split into
    # idle after a host sync and other idle (host-/launch-bound).
    _int("traced_steps", "steps", "steps whose GPU activity CUPTI traced", required=False, small=True),
    _seconds("traced_step_time_s", "the traced steps' event-timed time", required=False),
    _seconds("traced_busy_s", "GPU busy (kernels, copies, memsets) in the traced steps", required=False),
    _seconds("sync_idle_s", "GPU idle in the traced steps after a host sync", required=False),
    _seconds("launch_idle_s", "GPU idle in the traced steps not after a sync: host-/launch-bound", required=False),
    # Between the traced steps: the gaps the trace split (those holding the agent's own work left
    # out) and the GPU's idle time in them that a host sync began (it drained into the sync before
    # a step's end and idled on past it): the part of the data wait that the syncs cost.
    _int(
        "traced_gaps", "gaps", "step gaps between the traced steps (the agent's left out)", required=False, small=True
    ),
    _seconds("sync_idle_between_s", "GPU idle between the traced steps in gaps a host sync began", required=False),
    # The host's time blocked in sync calls (and blocking copies) in the traced steps and in those
    # gaps: the time it would have had, without them, to run ahead of the GPU.
    _seconds("sync_blocked_s", "the host's time blocked in syncs inside the traced steps", required=False),
    _seconds("sync_blocked_between_s", "the host's time blocked in syncs in the traced gaps", required=False),
    # Of `sync_idle_s`, the part in regions bracketed by syncs that each waited at most a few small
    # kernels (a loop of reads), and the host's time blocked in the reads that closed them.
    _seconds("sync_loop_idle_s", "GPU idle in the traced steps inside loops of host syncs", required=False),
    _seconds("sync_loop_blocked_s", "the host's time blocked in the reads closing those loops", required=False),
    _float("loss", "", "mean training loss", required=False, minimum=None),
    _float("lr", "", "learning rate", required=False, minimum=None),
    _float("grad_norm", "", "gradient norm", required=False),
    _float("gpu_util_pct", "%", "GPU utilisation (NVML), mean", wire="gpu.util_pct", required=False, maximum=100),
    _float("gpu_power_w", "W", "GPU power (NVML), mean", wire="gpu.power_w", required=False),
    _float("gpu_sm_clock_mhz", "MHz", "SM clock (NVML), mean", wire="gpu.sm_clock_mhz", required=False),
    _float("gpu_mem_used_bytes", "B", "GPU memory used (NVML)", wire="gpu.mem_used_bytes", required=False),
    _float("gpu_energy_j", "J", "GPU energy over the interval (NVML)", wire="gpu.energy_j", required=False),
)
FIELD = {f.name: f for f in FIELDS}


def wire_record(values: Mapping[str, Any]) -> dict[str, Any]:
    """A wire record's catalogue fields (docs/wire.md) from their values by field name: each at its
    wire path, in FIELDS order, a nested object where its first field is. A field without a value
    is left out, and an object none of whose fields has one is null (no NVML readings: "gpu":
    null). A field every record carries (required, no default) without a value, or a value of no
    field, is the sender's mistake: ValueError."""
    record: dict[str, Any] = {}
    placed = 0
    for f in FIELDS:
        holder = record
        for part in f.wire_path[:-1]:
            holder = holder.setdefault(part, {})
        if f.name in values:
            holder[f.wire_path[-1]] = values[f.name]
            placed += 1
        elif f.required and f.default is None:
            raise ValueError(f"the record needs {f.name!r} ({f.doc})")
    if placed != len(values):
        unknown = sorted(set(values) - {f.name for f in FIELDS})
        raise ValueError(f"no catalogue field is named {', '.join(map(repr, unknown))}")
    return {key: None if value == {} else value for key, value in record.items()}


class Ops(Protocol):
    """What a formula may do beyond +, - and *, for one kind of value (Python floats, numpy
    columns, SQL expressions), so that one definition evaluates on all of them:

    * ``ratio``: divide by something that may be 0; the result of a division by 0 is undefined
      (NaN, NULL) and stays undefined through the rest of the formula;
    * ``unless_missing``: ``value()`` where the optional reading ``reading`` is present, else 0
      (a callable, so that Python need not multiply a missing reading);
    * ``if_leader``: ``value`` where ``rank`` is 0, else 0.
    """

    def ratio(self, num: Any, den: Any) -> Any: ...

    def unless_missing(self, reading: Any, value: Callable[[], Any]) -> Any: ...

    def if_leader(self, rank: Any, value: Any) -> Any: ...


@dataclass(frozen=True)
class Sum:
    """Σ over intervals of the product of ``of`` (fields), over the intervals where ``present`` is
    set and, for a ``leader`` sum, only over rank 0's rows: every rank runs the same optimizer
    steps, so a count of steps is taken once (from rank 0), where work (tokens, GPU time) adds
    over ranks."""

    name: str
    of: tuple[str, ...]
    present: str | None = None
    leader: bool = False

    @property
    def reads(self) -> tuple[str, ...]:
        """The fields a row's contribution reads."""
        return (*self.of, *((self.present,) if self.present else ()), *(("rank",) if self.leader else ()))

    def value(self, fields: Mapping[str, Any], ops: Ops) -> Any:
        """A row's contribution (or each row's, for columns): the one definition every evaluator
        uses (Python, numpy at ingest and in the CSV, float8 SQL in PostgreSQL's CSV)."""

        def product() -> Any:
            value = fields[self.of[0]]
            for name in self.of[1:]:
                value = value * fields[name]
            return value

        value = product() if self.present is None else ops.unless_missing(fields[self.present], product)
        if self.leader:
            value = ops.if_leader(fields["rank"], value)
        return value


def _weighted_mean(weighted: str, weight: str, reading: str, by: str) -> tuple[Sum, Sum]:
    """An optional reading's weighted mean as two sums, both over the rows that carry it:
    Σ reading·by (`weighted`) and Σ by (`weight`)."""
    return Sum(weighted, (reading, by), present=reading), Sum(weight, (by,), present=reading)


SUMS: tuple[Sum, ...] = (
    Sum("steps", ("steps",), leader=True),  # optimizer steps, each once
    Sum("rank_steps", ("steps",)),  # steps times the ranks that ran them: per-rank means divide by this
    Sum("gpu_time_s", ("gpu_time_s",)),
    Sum("gpu_seconds", ("gpu_time_s", "gpus")),  # the GPU time the FLOPs were spread over
    Sum("tokens", ("tokens",)),
    Sum("real_tokens", ("real_tokens",)),
    # Each layer kind's attention sums, baseline then real documents, as FIELDS lists them.
    *(Sum(name, (name,)) for names in ATTENTION_SUMS.values() for name in (names.bshd, names.thd)),
    *(Sum(name, (name,)) for name in VISION_SUMS),
    Sum("expert_assignments", ("expert_assignments",), present="expert_assignments"),
    *(Sum(name, (name,)) for name in AUDIO_RECORD_SUMS),
    Sum("documents", ("documents",)),
    Sum("packs", ("packs",)),
    Sum("syncs_total", ("syncs_total",)),
    Sum("syncs_uncounted_steps", ("syncs_uncounted_steps",)),  # rank steps whose syncs were not counted
    # Each interval's step-time quantiles, weighted by its steps: the mean of the interval medians.
    Sum("step_p50_x_steps", ("step_time_p50_s", "steps")),
    Sum("step_p90_x_steps", ("step_time_p90_s", "steps")),
    # Loss is averaged over real tokens, as the trainer computes it (padding carries no loss).
    *_weighted_mean("loss_x_tokens", "loss_tokens", "loss", "real_tokens"),
    # The learning rate and gradient norm are read at each interval's end: weighted by its steps.
    *_weighted_mean("lr_x_steps", "lr_steps", "lr", "steps"),
    *_weighted_mean("grad_norm_x_steps", "grad_norm_steps", "grad_norm", "steps"),
    # NVML readings are interval means: weighted by the interval's host time.
    *_weighted_mean("gpu_util_x_s", "gpu_util_s", "gpu_util_pct", "host_time_s"),
    *_weighted_mean("gpu_power_x_s", "gpu_power_s", "gpu_power_w", "host_time_s"),
    *_weighted_mean("gpu_clock_x_s", "gpu_clock_s", "gpu_sm_clock_mhz", "host_time_s"),
    *_weighted_mean("gpu_mem_x_s", "gpu_mem_s", "gpu_mem_used_bytes", "host_time_s"),
    Sum("gpu_energy_j", ("gpu_energy_j",), present="gpu_energy_j"),
    Sum("energy_tokens", ("real_tokens",), present="gpu_energy_j"),
    # The ledger's measurements, each over the rows that carry it (docs/ledger.md).
    Sum("data_wait_s", ("data_wait_s",), present="data_wait_s"),
    Sum("data_wait_gaps", ("data_wait_gaps",), present="data_wait_s"),
    *(
        Sum(name, (name,), present="traced_steps")
        for name in ("traced_steps", "traced_step_time_s", "traced_busy_s", "sync_idle_s", "launch_idle_s")
    ),
    Sum("traced_gaps", ("traced_gaps",), present="traced_gaps"),
    Sum("sync_idle_between_s", ("sync_idle_between_s",), present="traced_gaps"),
    # The host's blocked time, over the traced steps and gaps of the rows that carry it.
    Sum("blocked_traced_steps", ("traced_steps",), present="sync_blocked_s"),
    Sum("blocked_traced_gaps", ("traced_gaps",), present="sync_blocked_s"),
    Sum("sync_blocked_s", ("sync_blocked_s",), present="sync_blocked_s"),
    Sum("sync_blocked_between_s", ("sync_blocked_between_s",), present="sync_blocked_s"),
    # The syncs' loops, over the traced steps (and their time) of the rows that carry them.
    Sum("loop_traced_steps", ("traced_steps",), present="sync_loop_idle_s"),
    Sum("loop_traced_step_time_s", ("traced_step_time_s",), present="sync_loop_idle_s"),
    Sum("sync_loop_idle_s", ("sync_loop_idle_s",), present="sync_loop_idle_s"),
    Sum("sync_loop_blocked_s", ("sync_loop_blocked_s",), present="sync_loop_idle_s"),
)
SUM_NAMES = tuple(s.name for s in SUMS)
# The fields any sum reads, in catalogue order: what a row needs to carry for `sums_of_rows`.
SUM_FIELDS = tuple(f.name for f in FIELDS if any(f.name in s.reads for s in SUMS))


SUM = {s.name: s for s in SUMS}


class RowSums(dict[str, float]):
    """One interval row's SUMS (`row`: field name -> value), each computed when a formula first
    reads it: a metric of a single row (a rank's step time in one interval) from the one
    definition, without the sums it does not read."""

    def __init__(self, row: Mapping[str, Any]) -> None:
        super().__init__()
        self.row = row

    def __missing__(self, name: str) -> float:
        value = self[name] = float(SUM[name].value(self.row, FLOAT_OPS))
        return value


def sums_of_rows(rows: Iterable[Mapping[str, Any]]) -> dict[str, float]:
    """The SUMS of interval rows (field name -> value), in Python: for tests and small windows."""
    out: dict[str, float] = dict.fromkeys(SUM_NAMES, 0)
    for row in rows:
        for s in SUMS:
            out[s.name] += s.value(row, FLOAT_OPS)
    return out


@dataclass(frozen=True)
class Coefficients:
    """What turns a run's raw sums into FLOPs and MFU (packscope.core.flops)."""

    c_lin: int  # FLOPs per token of the linear layers
    c_core: int  # FLOPs per unit of the full-causal attention sum S2 (the full-attention layers)
    peak_tflops: float | None  # per GPU; None when the GPU is unknown
    c_window: int = 0  # per unit of the sliding-window sum (the windowed layers)
    c_chunk: int = 0  # per unit of the chunked sum (the chunked layers)
    # FLOPs per unit of each vision sum (VisionSpec.c_by_sum); empty for a text-only model.
    c_vision: tuple[tuple[str, int], ...] = ()
    # FLOPs per assignment to a real expert (ModelSpec.c_assignment) of a model with zero-computation
    # experts, whose c_lin then leaves its routed experts out; 0 for any other model.
    c_assignment: int = 0
    # FLOPs per unit of each audio sum (audio_sums.c_totals); empty for a model without an audio tower.
    c_audio: tuple[tuple[str, int], ...] = ()

    @classmethod
    def for_run(cls, model: Mapping[str, Any], hardware: Mapping[str, Any]) -> Coefficients:
        spec = ModelSpec.from_dict(dict(model))
        by_kind = spec.c_core_by_kind
        return cls(
            c_lin=spec.c_lin_fixed,
            c_core=by_kind.get(FULL, 0),
            peak_tflops=hardware.get("peak_tflops"),
            c_window=by_kind.get(SLIDING, 0),
            c_chunk=by_kind.get(CHUNKED, 0),
            c_vision=() if spec.vision is None else tuple(sorted(spec.vision.c_by_sum.items())),
            c_assignment=spec.c_assignment,
            c_audio=() if spec.audio is None else tuple(sorted(c_totals(spec.audio).items())),
        )

    @staticmethod
    @functools.lru_cache(maxsize=1024)
    def of_json(model: str, hardware: str) -> Coefficients:
        """for_run of a model and hardware given as JSON text, cached on that text: ingest asks
        for the same run's at every batch and the runs list for a hundred runs a request, where
        reading a model (ModelSpec.from_dict) is not free
        (docs/benchmarks/2026-12-01-2core.md#dev-2026-12-01-afternoon)."""
        return Coefficients.for_run(json.loads(model), json.loads(hardware))

    # Both built once per instance (a runs list derives thirty metrics a run from one).
    @functools.cached_property
    def _by_kind(self) -> Mapping[str, float]:
        return MappingProxyType({FULL: float(self.c_core), SLIDING: float(self.c_window), CHUNKED: float(self.c_chunk)})

    @functools.cached_property
    def _by_sum(self) -> Mapping[str, float]:
        by_kind = self._by_kind
        return MappingProxyType(
            {names.name(view): by_kind[kind] for kind, names in ATTENTION_SUMS.items() for view in VIEWS}
        )

    def by_kind(self) -> Mapping[str, float]:
        """FLOPs per unit of each layer kind's attention sum, as floats (every evaluator rounds alike)."""
        return self._by_kind

    def by_sum(self) -> Mapping[str, float]:
        """The same per sum name (both views), as flops_by_kind reads them."""
        return self._by_sum


class FloatOps:
    """Formulas on Python floats: a division by 0 is NaN; a missing reading is None (or NaN)."""

    @staticmethod
    def ratio(num: float, den: float) -> float:
        return num / den if den else math.nan

    @staticmethod
    def unless_missing(reading: Any, value: Callable[[], Any]) -> Any:
        return 0 if reading is None or reading != reading else value()  # NaN != NaN

    @staticmethod
    def if_leader(rank: Any, value: Any) -> Any:
        return value if rank == 0 else 0


FLOAT_OPS = FloatOps()
Formula = Callable[[Mapping[str, Any], Coefficients, Ops], Any]


@dataclass(frozen=True)
class Metric:
    """A number shown to users: how it is labelled, formatted and derived from SUMS.

    ``formula(sums, coefficients, ops)`` uses only +, -, * and ``ops.ratio``; the sums are floats
    (or float arrays, or SQL expressions), never Python ints, so every evaluator rounds alike.
    """

    name: str
    label: str
    unit: str
    format: str  # a d3-format specifier, as plotly and the pages use it
    doc: str
    formula: Formula
    band: bool = False  # charts show the min-max of per-interval values around it
    # How much was done over the window (a sum: steps, tokens, FLOPs), not how fast: the pages show
    # it for the whole run, where rates leave the warm-up interval out (RunSummary.steady).
    amount: bool = False


def _tower(s: Mapping[str, Any], coefficients: tuple[tuple[str, int], ...]) -> Any:
    """A tower's FLOPs, Σ sum · coefficient over its sums with one: the same in every view (no
    patch or clip is padding, and a tower attends within each image or clip whether the decoder's
    rows are packed or not). Only + and *: floats, numpy arrays and SQL expressions alike."""
    total: Any = 0
    for name, value in coefficients:
        if value:
            total = total + s[name] * float(value)
    return total


def _vision(s: Mapping[str, Any], c: Coefficients) -> Any:
    return _tower(s, c.c_vision)


def _audio(s: Mapping[str, Any], c: Coefficients) -> Any:
    return _tower(s, c.c_audio)


class WindowSums(dict[str, Any]):
    """One window's float sums (derive), keeping each FLOPs count once computed: derive evaluates
    some thirty metrics, most of them from the same three counts. (PostgreSQL's CSV hands its
    formulas SQL expressions this way, with the counts already computed by name.)"""

    __slots__ = ("flops",)

    def __init__(self, sums: Mapping[str, Any]) -> None:
        super().__init__(sums)
        self.flops: dict[str, Any] = {}


def flops_count(kind: str, s: Mapping[str, Any], c: Coefficients) -> Any:
    """One of TRIAD's FLOPs counts of the sums `s`, as every FLOPs metric computes it (a
    WindowSums' `flops` holds those already computed, which are then taken as they are)."""
    known = s.flops if isinstance(s, WindowSums) else None
    if known is not None and kind in known:
        return known[kind]
    tokens, view = TRIAD[kind]  # the one count of flops_triad_by_kind asked for
    decoder = flops_by_kind(s[tokens], s, float(c.c_lin), c.by_sum(), view)
    if c.c_assignment:  # the routed experts at the assignments the routing made (every token slot's)
        decoder = decoder + s["expert_assignments"] * float(c.c_assignment)
    value = decoder + _vision(s, c) if c.c_vision else decoder
    if c.c_audio:
        value = value + _audio(s, c)
    if known is not None:
        known[kind] = value
    return value


def _attention(s: Mapping[str, Any], c: Coefficients, kinds: Iterable[str]) -> Any:
    """The THD-corrected count's attention term (QKᵀ and P·V over the real documents) of `kinds`."""
    total: Any = 0.0
    for kind in kinds:
        coefficient = c.by_kind()[kind]
        if coefficient:  # a kind the model lacks adds nothing, and its sum is not read
            total = total + s[ATTENTION_SUMS[kind].thd] * coefficient
    return total


def _flops_of(kind: str) -> Formula:
    return lambda s, c, ops: flops_count(kind, s, c)


def _tflops(kind: str) -> Formula:
    return lambda s, c, ops: ops.ratio(flops_count(kind, s, c) / 1e12, s["gpu_seconds"])


def _mfu(kind: str) -> Formula:
    # MFU is a fraction of the GPU's dense peak, not a percentage; an unknown peak divides by 0.
    return lambda s, c, ops: ops.ratio(_tflops(kind)(s, c, ops), float(c.peak_tflops or 0.0))


def overcount(bshd: Any, thd: Any, ops: Ops) -> Any:
    """overcount_pct of two FLOPs counts: how much more the baseline counts, in percent (also the
    calculator's, `packscope flops`)."""
    return 100.0 * (ops.ratio(bshd, thd) - 1.0)


def _overcount(s: Mapping[str, Any], c: Coefficients, ops: Ops) -> Any:
    return overcount(flops_count("bshd", s, c), flops_count("thd", s, c), ops)


def _attention_share(kinds: tuple[str, ...]) -> Formula:
    return lambda s, c, ops: 100.0 * ops.ratio(_attention(s, c, kinds), flops_count("thd", s, c))


def _padding(s: Mapping[str, Any], c: Coefficients, ops: Ops) -> Any:
    return 100.0 * (1.0 - ops.ratio(s["real_tokens"], s["tokens"]))


def sync_counted_steps(s: Mapping[str, Any]) -> Any:
    """The rank steps of sums `s` whose host syncs the agent counted (it samples intervals)."""
    return s["rank_steps"] - s["syncs_uncounted_steps"]


def _syncs_per_iter(s: Mapping[str, Any], c: Coefficients, ops: Ops) -> Any:
    return ops.ratio(s["syncs_total"], sync_counted_steps(s))  # undefined where none were counted


def _sum(name: str) -> Formula:
    return lambda s, c, ops: s[name]


def _per(num: str, den: str) -> Formula:
    return lambda s, c, ops: ops.ratio(s[num], s[den])


# The labels hold in both layouts: on a padded (BSHD) run the baseline is the dense work that ran
# (padding included), on a packed (THD) run it counts attention across documents that never ran;
# "per-document" (the THD-corrected count of docs/flops.md) is attention within each document in both.
_DOC_TFLOPS = {
    "bshd": "baseline: every pack or row counted as one dense sequence (T·C_lin + Σ L_pack²·C_core); "
    "the dense work on a padded run, more than was computed on a packed one",
    "thd": "per-document (THD-corrected): every token slot, attention within each real document only "
    "(T·C_lin + Σ s_i²·C_core)",
    "useful": "useful: real tokens only, attention over the real documents; comparable across layouts",
}
_LABEL = {"bshd": "baseline", "thd": "per-document", "useful": "useful"}


def _flops_metrics() -> list[Metric]:
    out = []
    for kind in ("bshd", "thd", "useful"):
        out.append(Metric(
            f"flops_{kind}", f"{_LABEL[kind]} FLOPs", "FLOP", ".4s", _DOC_TFLOPS[kind],
            _flops_of(kind), amount=True,
        ))  # fmt: skip
        out.append(Metric(
            f"tflops_{kind}", f"{_LABEL[kind]} TFLOP/s/GPU", "TFLOP/s", ".4g",
            f"{_DOC_TFLOPS[kind]}; per GPU: FLOPs ÷ Σ(gpu_time_s·gpus) ÷ 1e12", _tflops(kind), band=True,
        ))  # fmt: skip
        out.append(Metric(
            f"mfu_{kind}", f"MFU ({_LABEL[kind]})", "", ".1%",
            f"{_LABEL[kind]} TFLOP/s/GPU ÷ the GPU's dense bf16 peak", _mfu(kind),
        ))  # fmt: skip
    return out


METRICS: tuple[Metric, ...] = (
    Metric(
        "steps",
        "steps",
        "steps",
        ",d",
        "optimizer steps (each counted once, not once per rank)",
        _sum("steps"),
        amount=True,
    ),
    Metric("gpu_time_s", "GPU time", "s", ".4s", "Σ event-timed step durations", _sum("gpu_time_s"), amount=True),
    Metric("tokens", "token slots", "tokens", ".4s", "token slots, padding included", _sum("tokens"), amount=True),
    Metric("real_tokens", "real tokens", "tokens", ".4s", "tokens of real documents", _sum("real_tokens"), amount=True),
    Metric("documents", "documents", "documents", ",d", "real documents", _sum("documents"), amount=True),
    Metric("packs", "packs", "packs", ",d", "packs (THD) or rows (BSHD)", _sum("packs"), amount=True),
    *_flops_metrics(),
    Metric(
        "overcount_pct",
        "baseline excess",
        "%",
        ".1f",
        "how much more the baseline counts than the per-document count: 100·(baseline FLOPs ÷ per-document "
        "FLOPs − 1); attention over padding on a padded run, across document boundaries on a packed one",
        _overcount,
    ),
    Metric(
        "step_time_s",
        "step time",
        "s",
        ".4g",
        "a rank's step time: Σ GPU time ÷ Σ steps, both over every rank's rows (event-timed)",
        _per("gpu_time_s", "rank_steps"),
        band=True,
    ),
    Metric(
        "step_time_p50_s",
        "step time p50",
        "s",
        ".4g",
        "the intervals' median step times, averaged weighting each by its steps",
        _per("step_p50_x_steps", "rank_steps"),
    ),
    Metric(
        "step_time_p90_s",
        "step time p90",
        "s",
        ".4g",
        "the intervals' 90th-percentile step times, averaged weighting each by its steps",
        _per("step_p90_x_steps", "rank_steps"),
    ),
    Metric(
        "tokens_per_gpu_s",
        "token slots/s/GPU",
        "tokens/s",
        ".4s",
        "token slots (padding included) per GPU-second: Σ tokens ÷ Σ(gpu_time_s·gpus)",
        _per("tokens", "gpu_seconds"),
    ),
    Metric(
        "real_tokens_per_gpu_s",
        "real tokens/s/GPU",
        "tokens/s",
        ".4s",
        "real (non-padding) tokens per GPU-second: Σ real tokens ÷ Σ(gpu_time_s·gpus)",
        _per("real_tokens", "gpu_seconds"),
    ),
    Metric(
        "attention_share_pct",
        "attention share",
        "%",
        ".1f",
        "share of the per-document FLOPs spent in attention (QKᵀ and P·V over the real documents), all layer kinds",
        _attention_share(ATTENTION_KINDS),
    ),
    *(
        Metric(
            f"attention_{kind}_pct",
            f"{label} attention",
            "%",
            ".1f",
            f"share of the per-document FLOPs spent in the {label} attention layers (0 for a model without them)",
            _attention_share((kind,)),
        )
        for kind, label in ((FULL, "full"), (SLIDING, "sliding-window"), (CHUNKED, "chunked"))
    ),
    Metric(
        "vision_share_pct",
        "vision tower",
        "%",
        ".1f",
        "share of the per-document FLOPs spent in the vision tower (its GEMMs and attention; 0 for a text model)",
        lambda s, c, ops: 100.0 * ops.ratio(_vision(s, c), flops_count("thd", s, c)),
    ),
    Metric(
        "audio_share_pct",
        "audio tower",
        "%",
        ".1f",
        "share of the per-document FLOPs spent in the audio tower (its GEMMs and attention; 0 without one)",
        lambda s, c, ops: 100.0 * ops.ratio(_audio(s, c), flops_count("thd", s, c)),
    ),
    Metric("padding_pct", "padding", "%", ".1f", "share of token slots that hold no real token", _padding),
    Metric(
        "syncs_per_iter",
        "syncs/iteration",
        "syncs",
        ".3g",
        "host synchronizations per optimizer step of one rank: Σ syncs ÷ Σ steps over every rank's rows, "
        "the steps whose syncs were counted",
        _syncs_per_iter,
    ),
    Metric("loss", "loss", "", ".4g", "training loss, averaged over real tokens", _per("loss_x_tokens", "loss_tokens")),
    Metric(
        "lr",
        "learning rate",
        "",
        ".3g",
        "the trainer's learning rate at each interval's end, averaged weighting each interval by its steps",
        _per("lr_x_steps", "lr_steps"),
    ),
    Metric(
        "grad_norm",
        "gradient norm",
        "",
        ".4g",
        "the gradient norm the trainer reported at each interval's end, averaged weighting each interval by its steps",
        _per("grad_norm_x_steps", "grad_norm_steps"),
    ),
    Metric(
        "gpu_util_pct",
        "GPU utilisation",
        "%",
        ".1f",
        "NVML utilisation, time-weighted",
        _per("gpu_util_x_s", "gpu_util_s"),
    ),
    Metric("gpu_power_w", "GPU power", "W", ".4g", "NVML power, time-weighted", _per("gpu_power_x_s", "gpu_power_s")),
    Metric(
        "gpu_sm_clock_mhz",
        "SM clock",
        "MHz",
        ".4g",
        "NVML SM clock, time-weighted",
        _per("gpu_clock_x_s", "gpu_clock_s"),
    ),
    Metric(
        "gpu_mem_used_bytes",
        "GPU memory used",
        "B",
        ".4s",
        "NVML memory in use, time-weighted",
        _per("gpu_mem_x_s", "gpu_mem_s"),
    ),
    Metric(
        "data_wait_step_s",
        "host time between steps",
        "s",
        ".3s",
        "the GPU's idle time between two steps, per step gap: Σ idle ÷ Σ gaps (a step's end event to the "
        "next one's begin; the host clock on the CPU): the trainer's host work outside the step, its "
        "loader's wait or other, that the GPU's queue did not cover",
        _per("data_wait_s", "data_wait_gaps"),
    ),
    Metric(
        "sync_idle_pct",
        "idle after host syncs",
        "%",
        ".1f",
        "the GPU's idle time inside the traced steps that follows a host sync, in % of their step time (CUPTI)",
        lambda s, c, ops: 100.0 * ops.ratio(s["sync_idle_s"], s["traced_step_time_s"]),
    ),
    Metric(
        "launch_idle_pct",
        "host-/launch-bound idle",
        "%",
        ".1f",
        "the GPU's other idle time inside the traced steps (the host late to launch), in % of their step time (CUPTI)",
        lambda s, c, ops: 100.0 * ops.ratio(s["launch_idle_s"], s["traced_step_time_s"]),
    ),
    Metric(
        "energy_per_token_j",
        "energy/token",
        "J",
        ".3s",
        "NVML energy ÷ real tokens",
        _per("gpu_energy_j", "energy_tokens"),
    ),
)
METRIC = {m.name: m for m in METRICS}
BAND_METRICS = tuple(m.name for m in METRICS if m.band)


def evaluate(sums: Mapping[str, Any], c: Coefficients, ops: Ops, names: Iterable[str] | None = None) -> dict[str, Any]:
    """Every (or the named) metric's formula on `sums` with `ops`, undefined values left as the
    evaluator represents them (NaN, NULL): the building block of every evaluator."""
    chosen = METRICS if names is None else [METRIC[n] for n in names]
    return {m.name: m.formula(sums, c, ops) for m in chosen}


def derive(sums: Mapping[str, float], c: Coefficients, names: Iterable[str] | None = None) -> dict[str, float | None]:
    """Every (or the named) derived metric of one window; None where it is undefined (0/0).

    Every metric of a window is remembered by its sums' exact bits (and the coefficients): the runs
    list derives each listed run's totals and steady window on every poll, and a finished run's
    sums never change, so most of those are found again instead of evaluated
    (docs/benchmarks/2026-12-02-2core.md#dev-2026-12-02)."""
    floats = [float(sums[name]) for name in SUM_NAMES]
    if names is None:
        return dict(_derive_every(struct.pack(_SUMS_LAYOUT, *floats), c))
    return _derived(floats, c, names)


def _derived(floats: list[float], c: Coefficients, names: Iterable[str] | None) -> dict[str, float | None]:
    values = evaluate(WindowSums(dict(zip(SUM_NAMES, floats, strict=True))), c, FLOAT_OPS, names)
    return {name: value if math.isfinite(value) else None for name, value in values.items()}


# The SUM_NAMES as float64s: the key of a window's metrics, exact where floats compare loosely
# (-0.0 == 0.0, NaN != NaN).
_SUMS_LAYOUT = f"<{len(SUM_NAMES)}d"


@functools.lru_cache(maxsize=4096)
def _derive_every(packed: bytes, c: Coefficients) -> MappingProxyType[str, float | None]:
    return MappingProxyType(_derived(list(struct.unpack(_SUMS_LAYOUT, packed)), c, None))


def as_json() -> dict[str, Any]:
    """The catalogue as the pages and API clients read it."""
    return {
        "fields": [
            {"name": f.name, "kind": f.kind, "unit": f.unit, "doc": f.doc, "wire": ".".join(f.wire_path)}
            for f in FIELDS
        ],
        "metrics": [
            {
                "name": m.name,
                "label": m.label,
                "unit": m.unit,
                "format": m.format,
                "doc": m.doc,
                "band": m.band,
                "amount": m.amount,
            }
            for m in METRICS
        ],
    }
