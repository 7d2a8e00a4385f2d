"""RunSummary (docs/api.md): a run's registration, shown status, totals, steady rates and
refused intervals, read from the run totals; every derived number from the catalogue's
formulas (catalogue.derive on floats)."""

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import bindparam, func, select
from sqlalchemy.orm import Session

from packscope.backend.reads.liveness import as_utc, last_contact, shown_status
from packscope.backend.store.first_interval import FirstInterval, first_interval_sums, steady_sums
from packscope.backend.store.models import Run, alerts, refused_intervals, run_totals
from packscope.backend.store.runs import coefficients
from packscope.core.catalogue import derive
from packscope.core.largest_loss import largest_loss

_REFUSALS = (
    select(
        refused_intervals.c.run_pk,
        refused_intervals.c.refused_by,
        refused_intervals.c.reason,
        func.count(),
        func.min(refused_intervals.c.first_step),
        func.max(refused_intervals.c.last_step),
    )
    .where(refused_intervals.c.run_pk.in_(bindparam("pks", expanding=True)))
    .group_by(refused_intervals.c.run_pk, refused_intervals.c.refused_by, refused_intervals.c.reason)
)


def refusals(session: Session, run_pks: Sequence[int]) -> dict[int, dict[str, Any]]:
    """Per run with refused intervals: how many, their step span, and the most frequent reason."""
    if not run_pks:
        return {}
    rows = session.execute(_REFUSALS, {"pks": list(run_pks)}).all()
    out: dict[int, dict[str, Any]] = {}
    for pk, by, reason, n, first_step, last_step in rows:
        found = out.setdefault(pk, {"intervals": 0, "first_step": first_step, "last_step": last_step, "reasons": []})
        found["intervals"] += int(n)
        found["first_step"] = min(found["first_step"], first_step)
        found["last_step"] = max(found["last_step"], last_step)
        found["reasons"].append({"by": by, "reason": reason, "intervals": int(n)})
    for found in out.values():
        found["reasons"].sort(key=lambda r: (-r["intervals"], r["reason"]))
    return out


def _summary(
    run: Run,
    sums: Mapping[str, Any] | None,
    first: FirstInterval | None,
    refused: dict[str, Any] | None,
    now: datetime,
    with_config: bool = True,
    open_alerts: list[dict[str, str]] | None = None,
) -> dict[str, Any]:
    c = coefficients(run)
    totals = None if sums is None else derive(sums, c)
    steady = None if sums is None else steady_sums(sums, first)
    summary = {
        "run_id": run.run_id,
        "name": run.name,
        "project": run.project,
        "tags": run.tags,
        "layout": run.layout_seen or run.layout,
        "layout_declared": run.layout,
        "pack_length": run.pack_length,
        "pack_length_from": run.pack_length_from,
        "cross_documents": run.cross_documents,
        "cross_documents_detail": run.cross_documents_detail,
        "status": shown_status(run, now),
        "last_contact_at": last_contact(run),
        "heartbeat_s": run.heartbeat_s,
        "started_at": as_utc(run.started_at),
        "ended_at": as_utc(run.ended_at),
        "updated_at": as_utc(run.updated_at),
        "model": run.model,
        "hardware": run.hardware,
        "parallel": run.parallel,
        "c_lin": c.c_lin,
        "c_core": c.c_core,
        "records": 0 if sums is None else int(sums["rows"]),
        "ranks": None if first is None else first.rows,
        "first_step": None if first is None else first.first_step,
        "last_step": None if sums is None else int(sums["last_step"]),
        "totals": totals,
        # The steady window starts after the first interval: the pages say so beside its numbers.
        "steady": None if steady is None else derive(steady, c),
        "steady_first_step": None if steady is None or first is None else first.last_step + 1,
        # The ledger's largest loss over the window the rates cover (steady, else the whole run).
        "largest_loss": None if sums is None else largest_loss(steady or sums, c, run.layout_seen or run.layout),
        "refused": refused,
        "open_alerts": open_alerts or [],
        "notes": run.notes,
        "archived": run.archived,
    }
    if with_config:
        summary["config"] = run.config
    return summary


_TOTALS_OF_RUNS = select(run_totals).where(run_totals.c.run_pk.in_(bindparam("pks", expanding=True)))


def run_summaries(session: Session, runs: Sequence[Run], *, with_config: bool = True) -> list[dict[str, Any]]:
    """RunSummary dicts (docs/api.md) for `runs`, in the order given; one read of the run totals.
    Without their configs for the runs list (whose runs are loaded without them, list_runs)."""
    if not runs:
        return []
    found = session.execute(_TOTALS_OF_RUNS, {"pks": [r.id for r in runs]})
    by_run: dict[int, Mapping[str, Any]] = {row.run_pk: dict(row._mapping) for row in found}
    firsts = first_interval_sums(session, list(by_run))
    refused = refusals(session, [r.id for r in runs])
    alerting = open_alerts(session, [r.id for r in runs])
    now = datetime.now(UTC)
    return [
        _summary(
            run, by_run.get(run.id), firsts.get(run.id), refused.get(run.id), now, with_config, alerting.get(run.id)
        )
        for run in runs
    ]


_OPEN_ALERTS = (
    select(alerts.c.run_pk, alerts.c.rule, alerts.c.subject)
    .where(alerts.c.run_pk.in_(bindparam("pks", expanding=True)), alerts.c.resolved_at.is_(None))
    .order_by(alerts.c.run_pk, alerts.c.opened_at, alerts.c.id)
)


def open_alerts(session: Session, run_pks: Sequence[int]) -> dict[int, list[dict[str, str]]]:
    """Per run, its open alerts' rule and subject, oldest first (docs/alerts.md): the runs list's
    badge. The alerts layer writes them; this only reads the table."""
    out: dict[int, list[dict[str, str]]] = {}
    for run_pk, rule, subject in session.execute(_OPEN_ALERTS, {"pks": list(run_pks)}):
        out.setdefault(run_pk, []).append({"rule": rule, "subject": subject})
    return out


def run_summary(session: Session, run: Run) -> dict[str, Any]:
    return run_summaries(session, [run])[0]
