"""Sending the outbox's webhook messages: a process claims due messages (claimed_by and a lease,
with FOR UPDATE SKIP LOCKED on PostgreSQL), sends them with httpx, and marks each sent, or due again
after an exponential backoff. A message is sent by one process at a time; one whose sender died
is taken over once its lease has run out. A resolve waits for its open to be sent to that target.
"""

from __future__ import annotations

import asyncio
import socket
import time
import uuid
from collections.abc import Collection
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import Connection, Engine, exists, or_, select, update
from sqlalchemy.orm import aliased

from packscope.backend.alerts.config import AlertConfig, webhooks_of
from packscope.backend.alerts.state import event_id, signature
from packscope.backend.store.db import WRITES
from packscope.backend.store.models import alert_outbox

CLAIM_AT_ONCE = 20
PROCESS_ID = f"{socket.gethostname()[:40]}-{uuid.uuid4().hex[:12]}"


@dataclass(frozen=True)
class Message:
    id: int
    alert_id: int
    event: str
    target: str
    body: str
    attempts: int


def claim(
    connection: Connection,
    claimer: str,
    lease_s: float,
    now: datetime,
    limit: int = CLAIM_AT_ONCE,
    resting: Collection[str] = (),
) -> list[Message]:
    """Claim up to `limit` due messages for `claimer`, none to a `resting` target (the caller commits)."""
    o, opened = alert_outbox, aliased(alert_outbox)
    open_unsent = exists().where(
        opened.c.alert_id == o.c.alert_id, opened.c.target == o.c.target,
        opened.c.event == "opened", opened.c.sent_at.is_(None),
    )  # fmt: skip
    due = (
        select(o.c.id)
        .where(
            o.c.sent_at.is_(None),
            o.c.next_attempt_at <= now,
            or_(o.c.claimed_by.is_(None), o.c.claim_expires_at < now),
            or_(o.c.event != "resolved", ~open_unsent),
            *((o.c.target.not_in(list(resting)),) if resting else ()),
        )
        .order_by(o.c.id)
        .limit(limit)
    )
    if connection.dialect.name == "postgresql":
        due = due.with_for_update(skip_locked=True)
    rows = connection.execute(
        update(o)
        .where(o.c.id.in_(due))
        .values(claimed_by=claimer, claim_expires_at=now + timedelta(seconds=lease_s))
        .returning(o.c.id, o.c.alert_id, o.c.event, o.c.target, o.c.body, o.c.attempts)
    ).all()
    return sorted((Message(*row) for row in rows), key=lambda m: m.id)


def mark_sent(connection: Connection, message: Message, claimer: str) -> None:
    o = alert_outbox
    connection.execute(
        update(o)
        .where(o.c.id == message.id, o.c.claimed_by == claimer)
        .values(sent_at=datetime.now(UTC), claimed_by=None, claim_expires_at=None, attempts=message.attempts + 1)
    )


def mark_failed(connection: Connection, message: Message, claimer: str, error: str, config: AlertConfig) -> None:
    o = alert_outbox
    wait = min(config.retry_max_s, config.retry_base_s * 2**message.attempts)
    connection.execute(
        update(o)
        .where(o.c.id == message.id, o.c.claimed_by == claimer)
        .values(
            attempts=message.attempts + 1,
            next_attempt_at=datetime.now(UTC) + timedelta(seconds=wait),
            claimed_by=None,
            claim_expires_at=None,
            last_error=error[:2000],
        )
    )


def pending(connection: Connection) -> int:
    """Messages not sent yet."""
    return len(connection.execute(select(alert_outbox.c.id).where(alert_outbox.c.sent_at.is_(None))).all())


class Deliverer:
    """Sends this process's share of the outbox from the event loop (async httpx: a slow or dead
    receiver holds only its own coroutine); the database work runs in a thread."""

    def __init__(self, engine: Engine, config: AlertConfig, claimer: str = PROCESS_ID) -> None:
        self.engine, self.config, self.claimer = engine, config, claimer
        self.writer = engine.execution_options(**{WRITES: True})
        self.client = httpx.AsyncClient(timeout=config.send_timeout_s, follow_redirects=False)
        # A target that failed rests (backoff per target, doubling to retry_max_s) before this
        # process sends it anything else: a dead receiver costs one round of tries per rest, not a
        # try of every pending message every few seconds.
        self._resting: dict[str, tuple[float, int]] = {}  # target -> (monotonic end of its rest, failures in a row)

    def _rested(self) -> list[str]:
        now = time.monotonic()
        return [target for target, (until, _) in self._resting.items() if until > now]

    def _note(self, results: list[tuple[Message, str | None]]) -> None:
        failed = {m.target for m, error in results if error is not None}
        for target in {m.target for m, _ in results}:
            if target not in failed:
                self._resting.pop(target, None)
                continue
            failures = self._resting.get(target, (0.0, 0))[1] + 1
            rest = min(self.config.retry_max_s, self.config.retry_base_s * 2 ** (failures - 1))
            self._resting[target] = (time.monotonic() + rest, failures)

    def _claim(self) -> tuple[list[Message], str | None]:
        # A read first: the claim's write transaction (on SQLite, the database's write lock, which
        # ingest waits for) is taken only when a message is due.
        with self.engine.connect() as connection:
            due = connection.execute(
                select(alert_outbox.c.id)
                .where(alert_outbox.c.sent_at.is_(None), alert_outbox.c.next_attempt_at <= datetime.now(UTC))
                .limit(1)
            ).first()
        if due is None:
            return [], None
        with self.writer.begin() as connection:
            now = datetime.now(UTC)
            messages = claim(connection, self.claimer, self.config.claim_s, now, resting=self._rested())
            secret = webhooks_of(connection, self.config).secret if messages else None
        return messages, secret

    def _finish(self, results: list[tuple[Message, str | None]]) -> None:
        with self.writer.begin() as connection:
            for message, error in results:
                if error is None:
                    mark_sent(connection, message, self.claimer)
                else:
                    mark_failed(connection, message, self.claimer, error, self.config)

    async def _send(self, message: Message, secret: str | None) -> str | None:
        body = message.body.encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "packscope-alerts",
            "X-Packscope-Event-Id": event_id(message.alert_id, message.event),
        }
        if secret:
            headers["X-Packscope-Signature"] = signature(body, secret)
        try:
            answer = await self.client.post(message.target, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return f"{type(exc).__name__}: {exc}"
        return None if 200 <= answer.status_code < 300 else f"HTTP {answer.status_code}"

    async def deliver_once(self) -> int:
        """Claim, send and mark one round of due messages; how many were claimed."""
        messages, secret = await asyncio.to_thread(self._claim)
        if not messages:
            return 0
        errors = await asyncio.gather(*(self._send(m, secret) for m in messages))
        results = list(zip(messages, errors, strict=True))
        self._note(results)
        await asyncio.to_thread(self._finish, results)
        return len(messages)

    async def aclose(self) -> None:
        await self.client.aclose()
