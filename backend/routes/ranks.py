"""GET /api/v1/runs/{run_id}/ranks: each rank's step time, and the stragglers (backend/reads/ranks.py)."""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from packscope.backend.http.deps import RunIdPath, SessionDep, require_read_token, run_or_404
from packscope.backend.reads import ranks
from packscope.core.catalogue import INT64_MAX

router = APIRouter(prefix="/api/v1", tags=["reads"], dependencies=[Depends(require_read_token)])


class RankStepTimes(BaseModel):
    run_id: str
    ranks: list[int] = Field(description="the ranks that sent any of the intervals below, ascending")
    interval: list[int] = Field(description="the sampled interval indexes (evenly strided over the range)")
    step: list[int] = Field(description="each sampled interval's last step")
    step_time_s: list[list[float | None]] = Field(
        description="per rank (in `ranks` order), per sampled interval: GPU time ÷ steps; null where "
        "the rank has not sent that interval"
    )
    slowest_rank: list[int] = Field(description="per interval, the rank with the longest step time")
    slowest_s: list[float] = Field(description="per interval, the slowest rank's step time")
    median_s: list[float] = Field(description="per interval, the median over the ranks that sent it")
    spread: list[float | None] = Field(description="per interval, slowest ÷ median (1 = no straggler)")
    reporting_ranks: list[int] = Field(description="per interval, how many ranks have sent it")


@router.get("/runs/{run_id}/ranks", response_model=RankStepTimes)
def get_ranks(
    run_id: RunIdPath,
    session: SessionDep,
    max_points: Annotated[int, Query(ge=1, le=1000, description="intervals to sample")] = 200,
    step_min: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
    step_max: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
) -> dict[str, Any]:
    run = run_or_404(session, run_id)
    return ranks.rank_step_times(session, run, max_points, step_min, step_max)
