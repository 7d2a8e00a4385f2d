"""Request and response bodies of the wire contract (docs/wire.md) and the read API (docs/api.md).

Unknown fields are ignored rather than rejected, so a newer agent can still talk to this server.
"""

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    Field,
    PlainValidator,
    StrictBool,
    StringConstraints,
    WithJsonSchema,
    create_model,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema

from packscope.backend.api.text import SafeStr, storable_json
from packscope.core.catalogue import BAND_METRICS, INT32_MAX, INT64_MAX, METRIC
from packscope.core.flops import ModelSpec, model_json_schema

# The one rule of a run id (docs/wire.md): 1-64 characters of [A-Za-z0-9_.-], but not "." or "..",
# which browsers and curl resolve away as path segments (/runs/.. is /), so no page or DELETE of
# such a run could be reached. Written without look-ahead, which pydantic's regex engine lacks.
RUN_ID_PATTERN = r"^(?:[A-Za-z0-9_-][A-Za-z0-9_.-]?|\.[A-Za-z0-9_-]|[A-Za-z0-9_.-]{3,64})$"

RunId = Annotated[str, StringConstraints(pattern=RUN_ID_PATTERN)]
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
SmallCount = Annotated[int, Field(ge=0, le=INT32_MAX)]
Positive = Annotated[int, Field(ge=1, le=INT32_MAX)]
RunStatus = Literal["running", "finished", "failed"]  # what the agent sets (PATCH)
# What the reads show: a running run whose agent stopped calling is stale, then crashed
# (backend/reads/liveness.py, shown_status); a later heartbeat or record makes it running again.
ShownStatus = Literal["running", "stale", "crashed", "finished", "failed"]
DeclaredLayout = Literal["thd", "bshd"]  # what a run registers with
# What the agent found in the batches: padded rows, packed documents, packed with static shapes
# (a token mask, a dummy tail), or more than one of these.
SeenLayout = Literal["bshd", "thd", "thd-static", "mixed"]


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
def _json_integers(value: Any) -> Any:
    """JSON Schema's "integer" takes 8.0: whole floats become ints (the rest is ModelSpec's to judge)."""
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [_json_integers(item) for item in value]
    return value


def _model(value: Any) -> ModelSpec:
    # ModelSpec.from_dict is the one reading of a model dict: types, bounds, unknown and missing
    # fields named (a dataclass built by pydantic would take "1024" or drop a misspelt field).
    if not isinstance(value, dict):
        raise ValueError(f"a model is a JSON object, got {type(value).__name__}")
    return ModelSpec.from_dict({key: _json_integers(item) for key, item in value.items()})


# The body of `model`: validated by ModelSpec.from_dict alone, documented by its JSON schema.
ModelBody = Annotated[ModelSpec, PlainValidator(_model), WithJsonSchema(model_json_schema())]


# -- runs -----------------------------------------------------------------------------------------
MemoryBytes = Annotated[int, Field(ge=1, le=2**62), BeforeValidator(_a_number)]  # 8 or 8.0, as gpu_count


class Hardware(BaseModel):
    gpu_name: SafeStr | None = Field(default=None, max_length=200)
    gpu_count: StrictPositive = 1
    peak_tflops: Annotated[float, Field(strict=True, gt=0, le=1e9, allow_inf_nan=False)] | None = (
        None  # dense BF16, per GPU
    )
    memory_bytes: MemoryBytes | None = None  # one GPU's total: the ledger's memory headroom hint


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
    layout: DeclaredLayout
    started_at: datetime | None = None

    @field_validator("parallel")
    @classmethod
    def _parallel_defaults(cls, value: dict[str, int]) -> dict[str, int]:
        return {**PARALLEL_DEFAULTS, **value}


MAX_NOTES = 10_000
CrossDocuments = Literal["kept", "crossed", "not checked"]
MAX_CROSS_DETAIL = 300
Tag = Annotated[SafeStr, Field(max_length=100)]
Tags = Annotated[list[Tag], Field(max_length=50)]


class RunPatch(BaseModel):
    """The fields to change; those left out keep their value. `ended_at` goes with `status`."""

    # status, archived and layout cannot be null (the validator below): left out of the schema's types
    status: RunStatus | SkipJsonSchema[None] = None
    ended_at: datetime | None = None
    name: SafeStr | None = Field(default=None, max_length=200)  # null clears it
    notes: SafeStr | None = Field(default=None, max_length=MAX_NOTES)  # null clears it
    tags: Tags | None = None  # null clears them
    archived: StrictBool | SkipJsonSchema[None] = None
    # The agent's findings about the batches: the layout they had and the pack length its baseline
    # counted (null: the rows as the model ran them), with where that length came from.
    layout: SeenLayout | SkipJsonSchema[None] = None
    pack_length: StrictPositive | None = None
    pack_length_from: SafeStr | None = Field(default=None, max_length=200)
    # Whether the model kept packed documents apart, checked on a small copy of it (the HF
    # callback, agent/integrations/cross_documents.py), and what it found, in a sentence.
    cross_documents: CrossDocuments | SkipJsonSchema[None] = None
    cross_documents_detail: SafeStr | None = Field(default=None, max_length=MAX_CROSS_DETAIL)

    @model_validator(mode="after")
    def _something_to_change(self) -> "RunPatch":
        given = self.model_fields_set
        if not given:
            raise ValueError("nothing to change: send at least one of status, name, notes, tags, archived, layout")
        for key in ("status", "archived", "layout", "cross_documents"):
            if key in given and getattr(self, key) is None:
                raise ValueError(f"{key} cannot be null")
        if "ended_at" in given and self.status is None:
            raise ValueError("ended_at is only set together with status")
        return self


class IngestResult(BaseModel):
    accepted: int
    duplicates: int
    # Fields the batch sent that the record does not know (dotted paths): ignored, not stored.
    ignored: list[str] = Field(default_factory=list)


# -- reads ----------------------------------------------------------------------------------------
Totals = create_model("Totals", **dict.fromkeys(METRIC, (float | None, ...)))  # type: ignore[call-overload]


class OpenAlert(BaseModel):
    rule: str
    subject: str = Field(description='"rank 3", a sync site, or ""')


class LargestLoss(BaseModel):
    """The ledger's largest loss that a change to the loop removes (docs/ledger.md)."""

    name: str
    label: str
    pct_of_step: float
    ms_per_step: float
    status: Literal["measured", "estimated"]
    fix: str


class RunListItem(BaseModel):
    """A run as the runs list gives it: what the table shows, no config (GET /api/v1/runs/{id} has it)."""

    run_id: str
    name: str | None
    project: str | None
    tags: list[str]
    layout: str  # the layout seen in the batches, else the declared one
    status: ShownStatus
    started_at: datetime
    ended_at: datetime | None
    updated_at: datetime
    model: dict[str, Any]
    hardware: dict[str, Any]
    parallel: dict[str, Any]
    c_lin: int
    c_core: int
    records: int  # interval records stored: one per rank per interval
    # The ranks that sent the run's first interval (null before any): the run page asks for the
    # ranks panel only where there are two or more.
    ranks: int | None = None
    last_step: int | None
    totals: Totals | None  # type: ignore[valid-type]
    # The same metrics without the run's first interval (warm-up), once it has a second: what the
    # dashboard shows, so that compile or capture time does not stand for the run's speed.
    steady: Totals | None  # type: ignore[valid-type]
    # Over the steady window (else the whole run); null where no loss the loop removes was measured.
    largest_loss: LargestLoss | None = None
    notes: str
    archived: bool
    # The run's open alerts (docs/alerts.md), oldest first: what the runs list's badge shows.
    open_alerts: list[OpenAlert] = Field(default_factory=list)


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
