"""A run's row by its id and its FLOPs coefficients: what the write path and the read path both
need of a stored run."""

import msgspec
from sqlalchemy import bindparam, select
from sqlalchemy.orm import Session

from packscope.backend.store.models import Run
from packscope.core.catalogue import Coefficients

# A run's model and hardware as JSON with sorted keys: the key its coefficients are cached on,
# written in C (json.dumps was a tenth of a runs list's time: docs/benchmarks/2026-12-03-2core.md#dev-2026-12-03).
_SORTED_JSON = msgspec.json.Encoder(order="sorted")


def coefficients(run: Run) -> Coefficients:
    return Coefficients.of_json(_SORTED_JSON.encode(run.model).decode(), _SORTED_JSON.encode(run.hardware).decode())


# Built once (its construction cost more than its execution on a small run): parameter `run_id`.
_RUN_BY_ID = select(Run).where(Run.run_id == bindparam("run_id"))


def get_run(session: Session, run_id: str) -> Run | None:
    return session.scalars(_RUN_BY_ID, {"run_id": run_id}).one_or_none()
