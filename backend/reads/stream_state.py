"""What a run's live stream watches: it sends an event when this changes."""

from sqlalchemy import select
from sqlalchemy.orm import Session

from packscope.backend.store.models import Run, run_totals


def stream_state(session: Session, run: Run) -> tuple[int, int | None, int | None]:
    """(stored rows, latest interval, latest step): the stream sends an event when this changes."""
    totals = session.execute(
        select(run_totals.c.rows, run_totals.c.last_interval, run_totals.c.last_step).where(
            run_totals.c.run_pk == run.id
        )
    ).first()
    if totals is None:
        return 0, None, None
    return int(totals.rows), int(totals.last_interval), int(totals.last_step)
