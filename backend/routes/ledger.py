"""GET /api/v1/runs/{run_id}/ledger: where the run's step time went, from the peak down to the
useful work (backend/reads/ledger.py, packscope/core/ledger.py; docs/ledger.md)."""

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from packscope.backend.http.deps import RunIdPath, SessionDep, require_read_token, run_or_404
from packscope.backend.reads.ledger import run_ledger
from packscope.core.catalogue import INT64_MAX

router = APIRouter(prefix="/api/v1", tags=["reads"], dependencies=[Depends(require_read_token)])


class LedgerTerm(BaseModel):
    name: str = Field(description="peak, padding, host_syncs, stragglers, data_wait, launch_bound, remainder, useful")
    label: str
    ms_per_step: float | None = Field(description="a rank's ms per step; null where not measured or not applicable")
    pct_of_step: float | None = Field(description="percent of the window's step time")
    gpu_hours: float | None = Field(description="GPU-hours over the window")
    status: Literal["measured", "estimated", "not measured", "not applicable"]
    source: str = Field(description="what the value stands on, or what is missing")
    fix: str = Field(description="the fix, in one sentence (empty for the peak and the useful work)")
    loss: bool = Field(description="false for the two ends of the walk (the peak, the useful work)")
    within_step: bool = Field(
        default=True,
        description="false for time between steps (data_wait: the host time between steps): it lengthens the iteration",
    )
    gain: dict[str, float | None] | None = Field(
        default=None,
        description="if the loss were removed: step_ms_after, iteration_ms_after, mfu_useful_after, speedup_pct",
    )
    detail: dict[str, Any] = Field(description="the term's own figures (sync sites, the slowest rank, FLOPs)")


class Ledger(BaseModel):
    run_id: str
    window: Literal["steady", "run", "steps"] = Field(
        description="steady: every interval after the first; run: the only interval; steps: the step range asked"
    )
    first_step: int | None
    last_step: int | None
    layout: str
    ranks: int = Field(
        description="the most ranks that sent an interval of the window (its rank summaries; 0 for none): a count, "
        "not a list, so the answer is as small at 16,384 ranks as at 8"
    )
    steps: int | None = Field(description="optimizer steps in the window (each once)")
    step_time_ms: float | None = Field(description="a rank's step time over the window (the catalogue's step_time_s)")
    iteration_ms: float | None = Field(
        default=None, description="the step time plus the measured host time between steps"
    )
    gpu_hours: float | None
    terms: list[LedgerTerm] = Field(description="the peak, the losses (measured ones largest first), the useful work")
    overcount: LedgerTerm = Field(description="the baseline's over-count: a reporting error, not time (detail)")
    memory: dict[str, Any] = Field(
        default_factory=dict, description="memory headroom: a hint (status, free_pct, hint), not a time term"
    )


@router.get("/runs/{run_id}/ledger", response_model=Ledger)
def get_ledger(
    run_id: RunIdPath,
    session: SessionDep,
    first_step: Annotated[int | None, Query(ge=0, le=INT64_MAX, description="default: the steady window")] = None,
    last_step: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
) -> dict[str, Any]:
    return run_ledger(session, run_or_404(session, run_id), first_step, last_step)
