"""Request and response bodies of the wire contract (docs/wire.md) and the read API (docs/api.md).

Unknown fields are ignored rather than rejected, so a newer agent can still talk to this server.
"""

import math
from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, StringConstraints, field_validator, model_validator

from packscope.core.flops import ModelSpec

HISTOGRAM_BUCKETS = 24  # bucket b holds lengths in [2^b, 2^(b+1)); the last one is open
MAX_BATCH = 1000
RUN_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"
INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1  # the BIGINT columns' range

RunId = Annotated[str, StringConstraints(pattern=RUN_ID_PATTERN)]
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
SmallCount = Annotated[int, Field(ge=0, le=INT32_MAX)]
Positive = Annotated[int, Field(ge=1, le=INT32_MAX)]
Seconds = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
RunStatus = Literal["running", "finished", "failed"]
PARALLEL_DEFAULTS = {"dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1}


def _finite_or_none(value: float | None) -> float | None:
    # A diverged loss (NaN/inf) must not make the whole batch undeliverable; it is stored as missing.
    return value if value is None or math.isfinite(value) else None


# -- runs -----------------------------------------------------------------------------------------
class Hardware(BaseModel):
    gpu_name: str | None = Field(default=None, max_length=200)
    gpu_count: Positive = 1
    peak_tflops: Annotated[float, Field(gt=0, allow_inf_nan=False)] | None = None  # dense BF16, per GPU


class RunCreate(BaseModel):
    run_id: RunId
    name: str | None = Field(default=None, max_length=200)
    project: str | None = Field(default=None, max_length=200)
    tags: list[Annotated[str, Field(max_length=100)]] = Field(default_factory=list, max_length=50)
    config: dict[str, Any] = Field(default_factory=dict)
    model: ModelSpec
    hardware: Hardware = Field(default_factory=Hardware)
    parallel: dict[str, Positive] = Field(default_factory=lambda: dict(PARALLEL_DEFAULTS))
    layout: Literal["thd", "bshd"]
    started_at: datetime | None = None

    @field_validator("model", mode="before")
    @classmethod
    def _known_model_fields(cls, value: Any) -> Any:
        # The dataclass would silently drop a misspelt field and the FLOPs would be wrong.
        if isinstance(value, dict):
            known = set(ModelSpec.__dataclass_fields__) - {"name"}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValueError(
                    f"unknown model field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
                )
        return value

    @field_validator("parallel")
    @classmethod
    def _parallel_defaults(cls, value: dict[str, int]) -> dict[str, int]:
        return {**PARALLEL_DEFAULTS, **value}


class RunPatch(BaseModel):
    status: RunStatus
    ended_at: datetime | None = None


# -- interval records -----------------------------------------------------------------------------
class Histogram(BaseModel):
    count: list[Count] = Field(min_length=HISTOGRAM_BUCKETS, max_length=HISTOGRAM_BUCKETS)
    tokens: list[Count] = Field(min_length=HISTOGRAM_BUCKETS, max_length=HISTOGRAM_BUCKETS)


class Histograms(BaseModel):
    documents: Histogram
    packs: Histogram  # a pack's length is its real tokens


class SyncSite(BaseModel):
    site: str = Field(min_length=1, max_length=500)
    count: Count


class Syncs(BaseModel):
    total: Count
    per_iteration: Seconds
    sites: list[SyncSite] = Field(default_factory=list, max_length=100)

    @field_validator("sites")
    @classmethod
    def _unique_sites(cls, sites: list[SyncSite]) -> list[SyncSite]:
        seen: set[str] = set()
        for s in sites:
            if s.site in seen:
                raise ValueError(f"sync site {s.site!r} is listed twice; send each site once with its total")
            seen.add(s.site)
        return sites


class GpuStats(BaseModel):
    util_pct: Seconds | None = None
    power_w: Seconds | None = None
    sm_clock_mhz: Seconds | None = None
    mem_used_bytes: Seconds | None = None
    energy_j: Seconds | None = None


class IntervalRecord(BaseModel):
    interval: SmallCount
    rank: SmallCount
    first_step: Count
    last_step: Count
    steps: Positive
    gpus: Positive
    wall_start: Finite
    wall_end: Finite
    gpu_time_s: Seconds
    host_time_s: Seconds
    step_time_p50_s: Seconds
    step_time_p90_s: Seconds
    step_time_max_s: Seconds
    timing_lag_steps: SmallCount
    tokens: Count
    real_tokens: Count
    packs: Count
    documents: Count
    seqlen_sq_sum_bshd: Count
    seqlen_sq_sum_thd: Count
    flops_bshd: Seconds
    flops_thd: Seconds
    flops_useful: Seconds
    syncs: Syncs
    histograms: Histograms
    loss: float | None = None
    lr: float | None = None
    grad_norm: float | None = None
    channel_loss: dict[Annotated[str, Field(max_length=100)], float | None] | None = None
    gpu: GpuStats | None = None

    _finite = field_validator("loss", "lr", "grad_norm")(_finite_or_none)

    @field_validator("channel_loss")
    @classmethod
    def _finite_channels(cls, value: dict[str, float | None] | None) -> dict[str, float | None] | None:
        return None if value is None else {k: _finite_or_none(v) for k, v in value.items()}

    @model_validator(mode="after")
    def _consistent(self) -> "IntervalRecord":
        if self.first_step > self.last_step:
            raise ValueError(f"first_step ({self.first_step}) is after last_step ({self.last_step})")
        span = self.last_step - self.first_step + 1
        if self.steps > span:
            raise ValueError(
                f"steps ({self.steps}) is more than the {span} steps from first_step to last_step"
            )
        if self.real_tokens > self.tokens:
            raise ValueError(
                f"real_tokens ({self.real_tokens}) exceeds tokens ({self.tokens}); "
                "tokens counts every slot the model ran, padding included"
            )
        if self.wall_end < self.wall_start:
            raise ValueError(f"wall_end ({self.wall_end}) is before wall_start ({self.wall_start})")
        return self


class IntervalBatch(BaseModel):
    intervals: list[IntervalRecord] = Field(min_length=1, max_length=MAX_BATCH)


class IngestResult(BaseModel):
    accepted: int
    duplicates: int


# -- reads ----------------------------------------------------------------------------------------
class Totals(BaseModel):
    steps: int
    gpu_time_s: float
    tokens: int
    real_tokens: int
    documents: int
    packs: int
    flops_bshd: float
    flops_thd: float
    flops_useful: float
    tflops_bshd: float | None
    tflops_thd: float | None
    tflops_useful: float | None
    mfu_bshd: float | None
    mfu_thd: float | None
    mfu_useful: float | None
    overcount_pct: float | None
    step_time_s: float | None
    tokens_per_s: float | None
    padding_pct: float | None
    syncs_per_iter: float | None


class RunSummary(BaseModel):
    run_id: str
    name: str | None
    project: str | None
    tags: list[str]
    layout: str
    status: RunStatus
    started_at: datetime
    ended_at: datetime | None
    updated_at: datetime
    model: dict[str, Any]
    hardware: dict[str, Any]
    parallel: dict[str, Any]
    config: dict[str, Any]
    c_lin: int
    c_core: int
    intervals: int
    last_step: int | None
    totals: Totals | None


class RunList(BaseModel):
    runs: list[RunSummary]


class StepTimeTest(BaseModel):
    """Mann-Whitney U on per-interval step times of the last `window` intervals of each run."""

    run_id: str
    baseline_run_id: str
    window: int
    n: int
    n_baseline: int
    median_step_s: float | None
    median_step_s_baseline: float | None
    p_value: float | None  # None when a side has fewer than 2 intervals


class Comparison(RunList):
    step_time_tests: list[StepTimeTest]


class SeriesColumns(BaseModel):
    step: list[int]
    first_step: list[int]
    last_step: list[int]
    tflops_bshd: list[float | None]
    tflops_bshd_min: list[float | None]
    tflops_bshd_max: list[float | None]
    tflops_thd: list[float | None]
    tflops_thd_min: list[float | None]
    tflops_thd_max: list[float | None]
    tflops_useful: list[float | None]
    tflops_useful_min: list[float | None]
    tflops_useful_max: list[float | None]
    overcount_pct: list[float | None]
    mfu_thd: list[float | None]
    step_time_s: list[float | None]
    step_time_s_min: list[float | None]
    step_time_s_max: list[float | None]
    tokens_per_s: list[float | None]
    syncs_per_iter: list[float | None]
    loss: list[float | None]
    padding_pct: list[float | None]


class Series(BaseModel):
    run_id: str
    points: int
    columns: SeriesColumns


class HistogramRead(BaseModel):
    count: list[int]
    tokens: list[int]


class IntervalHistograms(BaseModel):
    interval: int
    first_step: int
    last_step: int
    edges: list[int]
    documents: HistogramRead
    packs: HistogramRead


class SyncSiteTotal(BaseModel):
    site: str
    count: int
    per_iteration: float | None


class SyncSites(BaseModel):
    syncs_per_iter: float | None
    sites: list[SyncSiteTotal]
