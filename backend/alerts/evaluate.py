"""One run judged and its alerts brought in line with the verdicts.

The judgement is first made on a read connection; only where it would open or resolve something
is it made again inside a write transaction that holds the run (PostgreSQL: a transaction-level
advisory lock on the run; SQLite: the write lock its BEGIN IMMEDIATE takes), so two processes never
act on verdicts from different moments of the run's data.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, text

from packscope.backend.alerts.config import AlertConfig, thresholds_for, webhooks_of
from packscope.backend.alerts.inputs import read_intervals, reported_through, run_facts, run_row, with_rank_details
from packscope.backend.alerts.rules import CLEAR, NAMES_RANK_DETAILS, ONE_PER_RUN, Firing, judge
from packscope.backend.alerts.state import open_alert, open_alerts, resolve_alert
from packscope.backend.store.db import WRITES

# An arbitrary first key of PostgreSQL's two-int advisory locks, the run's id being the second.
_LOCK_SPACE = 0x70_73_61_6C  # "psal"


@dataclass(frozen=True)
class Action:
    kind: str  # "open" or "resolve"
    rule: str
    subject: str
    firing: Firing | None = None
    alert_id: int | None = None
    through: int | None = None  # a resolve: the latest interval judged, which the alert then covers


def decide(
    connection: Connection, run_pk: int, config: AlertConfig, now: datetime
) -> tuple[Mapping[str, Any] | None, list[Action]]:
    run = run_row(connection, run_pk)
    if run is None:
        return None, []
    t = thresholds_for(connection, config, run["project"])
    facts = dataclasses.replace(run_facts(run, now), reported=reported_through(connection, run_pk))
    read = read_intervals(connection, run, t)
    opened = open_alerts(connection, run_pk)
    actions = _actions(judge(facts, read, t), opened, max((i.interval for i in read), default=None))
    if any(a.kind == "open" and a.rule in NAMES_RANK_DETAILS for a in actions):
        # What such an alert names (the sync site) needs every rank's row.
        read = with_rank_details(connection, run_pk, read)
        actions = _actions(judge(facts, read, t), opened, max((i.interval for i in read), default=None))
    return run, actions


def _actions(
    verdicts: Mapping[str, Mapping[str, Any]], opened: Mapping[tuple[str, str], int], through: int | None
) -> list[Action]:
    actions: list[Action] = []
    for rule, by_subject in verdicts.items():
        for subject, verdict in by_subject.items():
            if rule in ONE_PER_RUN:
                mine = [(s, i) for (r, s), i in opened.items() if r == rule]
                if verdict == CLEAR:
                    actions += [Action("resolve", rule, s, alert_id=i, through=through) for s, i in mine]
                elif not mine and isinstance(verdict, Firing):
                    actions.append(Action("open", rule, verdict.subject, verdict))
                continue
            held = opened.get((rule, subject))
            if verdict == CLEAR and held is not None:
                actions.append(Action("resolve", rule, subject, alert_id=held, through=through))
            elif isinstance(verdict, Firing) and held is None:
                actions.append(Action("open", rule, subject, verdict))
    return actions


def evaluate_run(engine: Engine, run_pk: int, config: AlertConfig) -> list[Action]:
    """Judge run `run_pk` and open or resolve its alerts; the actions taken."""
    with engine.connect() as connection:
        _, actions = decide(connection, run_pk, config, datetime.now(UTC))
        connection.rollback()
    if not actions:
        return []
    with engine.execution_options(**{WRITES: True}).begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(
                text("SELECT pg_advisory_xact_lock(:space, :run)"), {"space": _LOCK_SPACE, "run": run_pk}
            )
        run, actions = decide(connection, run_pk, config, datetime.now(UTC))
        if run is None:
            return []
        hooks = webhooks_of(connection, config)
        taken = []
        for action in actions:
            if action.kind == "open" and action.firing is not None:
                if open_alert(connection, run, action.rule, action.subject, action.firing, hooks, config.public_url):
                    taken.append(action)
            elif action.alert_id is not None and resolve_alert(
                connection, run, action.alert_id, hooks, config.public_url, action.through
            ):
                taken.append(action)
        return taken
