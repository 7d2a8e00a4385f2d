"""GET /api/v1/runs/{run_id}/ranks: the stragglers of each interval from the rank summaries, and each
rank's step time where asked (backend/reads/ranks.py)."""

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from packscope.backend.http.deps import RunIdPath, SessionDep, require_read_token, run_or_404
from packscope.backend.reads import ranks
from packscope.backend.store.rank_summaries import SLOWEST_KEPT
from packscope.core.catalogue import INT64_MAX

router = APIRouter(prefix="/api/v1", tags=["reads"], dependencies=[Depends(require_read_token)])


class RankStepTimes(BaseModel):
    run_id: str
    rank_count: int = Field(description="the most ranks any of the sampled intervals has from")
    interval: list[int] = Field(description="the sampled interval indexes (evenly strided over the range)")
    step: list[int] = Field(description="each sampled interval's last step")
    reporting_ranks: list[int] = Field(description="per interval, how many ranks have sent it")
    slowest_rank: list[int] = Field(
        description="per interval, the rank with the longest step time (the lowest among equals)"
    )
    slowest_s: list[float] = Field(description="per interval, the slowest rank's step time")
    median_s: list[float] = Field(
        description="per interval, the median over the ranks that sent it: exact where its log2 bucket "
        "(1/256 octave) holds one value, else within that bucket's width"
    )
    p90_s: list[float] = Field(description="per interval, the nearest-rank 90th percentile (as the median)")
    fastest_s: list[float] = Field(description="per interval, the fastest rank's step time")
    mean_s: list[float] = Field(description="per interval, the ranks' mean step time")
    spread: list[float | None] = Field(description="per interval, slowest ÷ median (1 = no straggler)")
    slowest_ranks: list[list[int]] = Field(description=f"per interval, its {SLOWEST_KEPT} slowest ranks, slowest first")
    slowest_ranks_s: list[list[float]] = Field(description="their step times, in the same order")
    matrix: bool = Field(description="whether `ranks` and `step_time_s` hold every rank's step time")
    ranks: list[int] = Field(description="the ranks that sent any of the intervals below, ascending (with the matrix)")
    step_time_s: list[list[float | None]] = Field(
        description="per rank (in `ranks` order), per sampled interval: GPU time ÷ steps; null where "
        "the rank has not sent that interval (with the matrix)"
    )


@router.get("/runs/{run_id}/ranks", response_model=RankStepTimes)
def get_ranks(
    run_id: RunIdPath,
    session: SessionDep,
    max_points: Annotated[int, Query(ge=1, le=1000, description="intervals to sample")] = 200,
    step_min: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
    step_max: Annotated[int | None, Query(ge=0, le=INT64_MAX)] = None,
    matrix: Annotated[
        bool | None,
        Query(
            description=f"every rank's step time too: by default for runs of up to {ranks.MATRIX_RANKS} ranks; "
            f"true for any run, over fewer intervals where ranks × intervals would pass {ranks.MATRIX_CELLS}"
        ),
    ] = None,
) -> dict[str, Any]:
    run = run_or_404(session, run_id)
    return ranks.rank_step_times(session, run, max_points, step_min, step_max, matrix)
