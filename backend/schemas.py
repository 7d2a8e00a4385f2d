"""Request and response bodies of the wire contract (docs/wire.md) and the read API (docs/api.md).

Unknown fields are ignored rather than rejected, so a newer agent can still talk to this server.
"""

import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    StrictBool,
    StringConstraints,
    create_model,
    field_validator,
    model_validator,
)

from packscope.backend.text import SafeStr, storable_json
from packscope.core.catalogue import BAND_METRICS, INT32_MAX, INT64_MAX, METRIC
from packscope.core.flops import ModelSpec

RUN_ID_PATTERN = r"^[A-Za-z0-9_.-]{1,64}$"

RunId = Annotated[str, StringConstraints(pattern=RUN_ID_PATTERN)]
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
SmallCount = Annotated[int, Field(ge=0, le=INT32_MAX)]
Positive = Annotated[int, Field(ge=1, le=INT32_MAX)]
RunStatus = Literal["running", "finished", "failed"]


def _a_number(value: Any) -> Any:
    # JSON Schema's "integer" takes 8.0 (pydantic's lax int does too, and refuses 8.5); text and
    # true/false are no numbers, though lax pydantic would take "8" and true.
    if isinstance(value, str | bool):
        raise ValueError(f"must be a JSON number, got {value!r}")
    return value


def whole_number(ge: int, le: int) -> Any:
    """An integer from ge to le, as a JSON number (8 or 8.0)."""
    return Annotated[int, Field(ge=ge, le=le), BeforeValidator(_a_number)]


StrictPositive = Annotated[int, Field(ge=1, le=INT32_MAX), BeforeValidator(_a_number)]
LayerFlag = Annotated[int, Field(ge=0, le=1), BeforeValidator(_a_number)]  # moe_layers: 1 = an MoE layer
PARALLEL_DEFAULTS = {"dp": 1, "tp": 1, "pp": 1, "cp": 1, "ep": 1}
# -- the FLOPs model of a run ----------------------------------------------------------------------
MODEL_FLAGS = {"gated", "attn_output_gate"}
MODEL_OPTIONAL = {"kv_heads", "head_dim", "moe_ffn"}
MODEL_POSITIVE = {"layers", "hidden", "heads", "ffn", "vocab", "vocab_divisor", "tp", "kv_heads"}  # ModelSpec's checks
MAX_MODEL_SIZE = 2**24  # any layer count, width or vocabulary of a real model
MODEL_FIELDS = [f for f in dataclasses.fields(ModelSpec) if f.name != "name"]  # the name is not stored


class _ModelChecks(BaseModel):
    """ModelSpec as a request body: every field typed and bounded in the schema as it is checked
    (a size beyond any real model would make FLOPs that no column or float holds), nothing else
    taken (a misspelt field would silently leave its default and the FLOPs would be wrong), and
    ModelSpec's checks across fields (head_dim, moe_layers) run as validation."""

    model_config = ConfigDict(extra="forbid")

    @model_validator(mode="before")
    @classmethod
    def _known_fields(cls, value: Any) -> Any:
        if isinstance(value, dict):
            known = {f.name for f in MODEL_FIELDS}
            unknown = sorted(set(value) - known)
            if unknown:
                raise ValueError(f"unknown model field(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> "_ModelChecks":
        self.spec()  # ModelSpec's ValueError is a 422 naming `model`
        return self

    def spec(self) -> ModelSpec:
        return ModelSpec(**self.model_dump())

    def to_dict(self) -> dict[str, Any]:
        return self.spec().to_dict()


def _model_field(f: "dataclasses.Field[Any]") -> tuple[Any, Any]:
    default = ... if f.default is dataclasses.MISSING else f.default
    if f.name in MODEL_FLAGS:
        return StrictBool, default
    if f.name == "moe_layers":  # one 0/1 flag per layer
        return list[LayerFlag] | None, default
    size = whole_number(1 if f.name in MODEL_POSITIVE else 0, MAX_MODEL_SIZE)
    return (size | None if f.name in MODEL_OPTIONAL else size), default


if TYPE_CHECKING:
    ModelBody = _ModelChecks
else:
    ModelBody = create_model("ModelBody", __base__=_ModelChecks, **{f.name: _model_field(f) for f in MODEL_FIELDS})


# -- runs -----------------------------------------------------------------------------------------
class Hardware(BaseModel):
    gpu_name: SafeStr | None = Field(default=None, max_length=200)
    gpu_count: StrictPositive = 1
    peak_tflops: Annotated[float, Field(strict=True, gt=0, le=1e9, allow_inf_nan=False)] | None = (
        None  # dense BF16, per GPU
    )


class RunCreate(BaseModel):
    run_id: RunId
    name: SafeStr | None = Field(default=None, max_length=200)
    project: SafeStr | None = Field(default=None, max_length=200)
    tags: list[Annotated[SafeStr, Field(max_length=100)]] = Field(default_factory=list, max_length=50)
    # Checked before anything is stored: depth, size, strings and numbers every backend can hold.
    config: Annotated[dict[str, Any], AfterValidator(storable_json)] = Field(default_factory=dict)
    model: ModelBody
    hardware: Hardware = Field(default_factory=Hardware)
    parallel: dict[Annotated[SafeStr, Field(max_length=20)], StrictPositive] = Field(
        default_factory=lambda: dict(PARALLEL_DEFAULTS), max_length=20
    )
    layout: Literal["thd", "bshd"]
    started_at: datetime | None = None

    @field_validator("parallel")
    @classmethod
    def _parallel_defaults(cls, value: dict[str, int]) -> dict[str, int]:
        return {**PARALLEL_DEFAULTS, **value}


MAX_NOTES = 10_000
Tag = Annotated[SafeStr, Field(max_length=100)]
Tags = Annotated[list[Tag], Field(max_length=50)]


class RunPatch(BaseModel):
    """The fields to change; those left out keep their value. `ended_at` goes with `status`."""

    status: RunStatus | None = None
    ended_at: datetime | None = None
    name: SafeStr | None = Field(default=None, max_length=200)  # null clears it
    notes: SafeStr | None = Field(default=None, max_length=MAX_NOTES)  # null clears it
    tags: Tags | None = None  # null clears them
    archived: StrictBool | None = None

    @model_validator(mode="after")
    def _something_to_change(self) -> "RunPatch":
        given = self.model_fields_set
        if not given:
            raise ValueError("nothing to change: send at least one of status, name, notes, tags, archived")
        for key in ("status", "archived"):
            if key in given and getattr(self, key) is None:
                raise ValueError(f"{key} cannot be null")
        if "ended_at" in given and self.status is None:
            raise ValueError("ended_at is only set together with status")
        return self


class IngestResult(BaseModel):
    accepted: int
    duplicates: int


# -- reads ----------------------------------------------------------------------------------------
Totals = create_model("Totals", **dict.fromkeys(METRIC, (float | None, ...)))  # type: ignore[call-overload]


class RunListItem(BaseModel):
    """A run as the runs list gives it: what the table shows, no config (GET /api/v1/runs/{id} has it)."""

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
    c_lin: int
    c_core: int
    records: int  # interval records stored: one per rank per interval
    last_step: int | None
    totals: Totals | None  # type: ignore[valid-type]
    # The same metrics without the run's first interval (warm-up), once it has a second: what the
    # dashboard shows, so that compile or capture time does not stand for the run's speed.
    steady: Totals | None  # type: ignore[valid-type]
    notes: str
    archived: bool


class RunSummary(RunListItem):
    """A run with everything stored of it: its config too."""

    config: dict[str, Any]


class RunListed(RunListItem):
    # Only the keys asked for with `config_keys` (dotted paths into the config), null where absent.
    config_values: dict[str, Any]


class RunList(BaseModel):
    runs: list[RunSummary]


class RunPage(BaseModel):
    """One page of GET /api/v1/runs: `total` counts every run that matches the filters."""

    runs: list[RunListed]
    total: int


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


SeriesColumns = create_model(  # type: ignore[call-overload]
    "SeriesColumns",
    step=(list[int], ...),
    first_step=(list[int], ...),
    last_step=(list[int], ...),
    **dict.fromkeys(METRIC, (list[float | None], ...)),
    **{f"{name}_{end}": (list[float | None], ...) for name in BAND_METRICS for end in ("min", "max")},
)


class Series(BaseModel):
    run_id: str
    points: int
    columns: SeriesColumns  # type: ignore[valid-type]


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
    per_iter: float | None


class SyncSites(BaseModel):
    syncs_per_iter: float | None
    sites: list[SyncSiteTotal]
