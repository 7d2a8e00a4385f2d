"""The sender thread: takes interval records off the trainer's hands and gets them to the server.

The trainer only calls `submit` (a non-blocking queue put) and, at the end, `close`. The thread
commits every record to the run's spool (packscope/core/spool.py) before sending it, sends the
spool's oldest records in gzip-compressed batches, and deletes them once the server has them, so
a kill -9 loses nothing committed. What a failed request leads to:

    no answer, 404, 408, 502, 504   the server is down: keep, retry with backoff
    401, 403                        wrong token: keep (an agent with the right token and the same
                                    run_id replays them), log an error
    429, 503                        keep, wait for the server's Retry-After, never less than the backoff
    any other 4xx                   halve the batch until the refused records are alone; set those
                                    aside with the server's message
    500 and any other 5xx           retry max_attempts times, then halve the same way; a record
                                    that still fails alone while the one after it goes through is
                                    set aside as poisoned

Set-aside records are tried again, alone, once the spool has caught up: at set_aside_retry_s, then
at twice the wait each time, for set_aside_max_attempts tries within set_aside_max_age_s.

Without a server (offline: `server=None` with a `spool_dir`) the thread only commits: the spool
keeps the records, the run's registration and its final status for `packscope sync`.

The server treats (run, rank, interval) as an idempotency key, so a record sent twice (after a
crash between the answer and the delete) is stored once. Nothing here raises into, or blocks,
the training loop; an unexpected error in the thread is logged and the thread carries on. What
became of every record is counted in `stats()`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import queue
import re
import threading
import time
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING

from packscope.agent.config import DEFAULT_SPOOL_DIR
from packscope.agent.contact import RunContact
from packscope.core.http_client import RETRY_AFTER_CAP_S, Backoff, HttpClient, HttpError
from packscope.core.spool import FINAL_KEY, RUN_KEY, Entry, Spool, SpoolError, encode

if TYPE_CHECKING:
    from packscope.agent.config import AgentConfig

log = logging.getLogger("packscope.agent")
_STOP = object()
IDLE_WAIT_S = 1.0  # the longest the thread sleeps with nothing to do (close() wakes it at once)
LOG_REPEAT_S = 300.0  # an unchanged problem is logged again after this long
SET_ASIDE_CHECK_S = 60.0  # how often the thread looks for set-aside records due for a retry


# -- where the spool lives ---------------------------------------------------------------------------
def spool_path(config: AgentConfig, run_id: str) -> Path:
    """<spool_dir>/<run_id>.sqlite: one spool per run, so a resumed run replays a killed one's."""
    return _spool_dir(config) / f"{_file_stem(run_id)}.sqlite"


def _spool_dir(config: AgentConfig) -> Path:
    return Path(config.spool_dir or DEFAULT_SPOOL_DIR).expanduser()


def _file_stem(run_id: str) -> str:
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", run_id)
    if safe != run_id:  # two run_ids must not share a file once their odd characters are replaced
        safe += "-" + hashlib.sha1(run_id.encode()).hexdigest()[:8]
    return safe


# -- HTTP answers ------------------------------------------------------------------------------------
class ServerError(Exception):
    """A request that did not succeed; `kind` decides what the sender does (module docstring)."""

    def __init__(
        self, message: str, status: int | None = None, retry_after: float | None = None, kind: str | None = None
    ) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status, None when no answer came
        self.retry_after = retry_after  # seconds, from the answer's Retry-After header
        self.kind = kind or _kind_of(status)
        self.registering = False  # the run's registration failed, not the records themselves


def _kind_of(status: int | None) -> str:
    if status in (401, 403):
        return "auth"
    if status in (429, 503):
        return "throttled"
    if status is None or status in (404, 408, 502, 504) or status < 400:
        return "down"  # no answer, no such route or run (yet), or a proxy without its backend
    return "refused" if status < 500 else "failing"


def _ingest_counts(answer: object) -> tuple[int, int]:
    try:
        return int(answer["accepted"]), int(answer["duplicates"])  # type: ignore[index]
    except (TypeError, KeyError, ValueError):
        # The records may or may not be stored: keep them; a resend is at worst a duplicate.
        raise ServerError(f"the server answered {str(answer)[:200]!r}, not an ingest result", kind="down") from None


class _Isolation:
    """Bookkeeping for finding, by halving a batch, the records the server will not take.

    It starts when a batch is refused (4xx) or keeps failing (5xx). While it is active, requests
    hold at most `size` records and none after `until_id`, the last record of that batch. It ends
    when the spool's oldest record is past `until_id`, or when a record was set aside as poisoned.
    """

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.until_id: int | None = None
        self.size = 0
        self.attempts = 0  # 5xx answers to the current request
        self.probing = False  # the next request is the record after the suspect, alone
        self.peer_ok = False  # that record just went through: the suspect fails on its own

    @property
    def active(self) -> bool:
        return self.until_id is not None

    def start(self, entries: list[Entry]) -> None:
        if not self.active:
            self.until_id, self.size, self.attempts = entries[-1].id, len(entries), 0

    def split(self, entries: list[Entry]) -> None:
        self.start(entries)
        self.size, self.attempts = (len(entries) + 1) // 2, 0


# -- the sender --------------------------------------------------------------------------------------
class Sender:
    def __init__(self, config: AgentConfig, run_id: str, run_body: dict) -> None:
        self.config = config
        self.offline = not config.server  # spool only, for `packscope sync`
        self.base = (config.server or "").rstrip("/")
        self._client = HttpClient(self.base, config.token, config.request_timeout_s)
        self.run_id = run_id
        self.run_body = run_body
        self.retry_s = config.retry_s  # read at each failure, so a test may shorten it on a live sender
        self.spool = Spool(spool_path(config, run_id), config.spool_max_bytes)
        self.queue: queue.Queue = queue.Queue(maxsize=config.queue_size)
        # What became of the records (see stats()); only `dropped` is written outside the thread.
        self.kept = 0
        self.sent = 0
        self.duplicates = 0
        self.rejected = 0
        self.poisoned = 0
        self.recovered = 0  # set-aside records delivered on a later try
        self.lost = 0
        self.dropped = 0
        self.last_error: str | None = None
        self._run_registered = False
        self._ignored_fields: set[str] = set()  # named by the server as not stored: warned once
        self._final_patch: dict | None = None
        self._status_delivered: bool | None = None  # the final PATCH; None while not tried
        self._closing = False  # close() was called: later submits are dropped
        self._stopping = False  # the thread has taken the stop mark off the queue
        self._deadline = math.inf  # set by close(): the thread gives up delivering then
        self._not_before = 0.0  # monotonic time of the next request (backoff, Retry-After)
        self._server_wait_until = 0.0  # end of the last Retry-After; close() honours it too
        self._failures = 0  # failed requests in a row, for the backoff
        self._iso = _Isolation()
        self._own_set_aside: set[int] = set()  # ids this process set aside and has not delivered since
        self._set_aside_check_at = 0.0  # monotonic time of the next look for due set-aside records
        self._last_logged: dict[str, float] = {}
        # Heartbeats, the run's findings and refusals, beside the records (agent/contact.py).
        self.contact = RunContact(config.heartbeat_s)
        self._thread = threading.Thread(target=self._run, name="packscope-sender", daemon=True)
        self._thread.start()

    # -- trainer side (never blocks, never raises) -----------------------------------------------
    def submit(self, record: dict) -> None:
        try:
            if self._closing:
                raise queue.Full
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 100 == 0:
                log.warning("packscope sender queue full: %d interval records dropped", self.dropped)

    def close(self, patch: dict | None, timeout_s: float = 30.0) -> bool:
        """Deliver what is queued or spooled, then the run's final status, within timeout_s.

        True only when everything reached the server. False when records stay in the spool (an
        agent started with the same run_id replays them) or were set aside, evicted, dropped or
        lost, or when the status could not be set; stats() says which.
        """
        if not self._closing:
            self._final_patch = patch
            self._deadline = time.monotonic() + timeout_s
            self._closing = True
            try:
                self.queue.put(_STOP, timeout=timeout_s)
            except queue.Full:
                return False
        # The thread bounds its own requests by the deadline; the grace covers closing the file.
        self._thread.join(max(0.0, self._deadline - time.monotonic()) + 0.5)
        return not self._thread.is_alive() and self._all_delivered()

    def stats(self) -> dict[str, int]:
        """What became of the records submitted to this process's sender."""
        return {
            "sent": self.sent,  # stored by the server
            "duplicates": self.duplicates,  # sent, and the server had them already (a replay)
            "spooled": len(self.spool),  # waiting in the spool now (an earlier process's included)
            "evicted": self.spool.evicted,  # dropped, oldest first, to keep the spool under its limit
            "rejected": self.rejected,  # refused by the server (4xx), set aside
            "poisoned": self.poisoned,  # failed alone (5xx) while the next one went through, set aside
            "recovered": self.recovered,  # set-aside records (this process's or earlier) delivered later
            "lost": self.lost,  # could not be kept: disk full
            "dropped": self.dropped,  # the queue was full, or the sender was closing
            "kept": self.kept,  # committed to the spool: from then on a crash cannot lose them
            "queued": self.queue.qsize(),
        }

    def _all_delivered(self) -> bool:
        """Everything reached the server; offline: everything reached the spool."""
        s = self.stats()
        missing = ("evicted", "lost", "dropped") if self.offline else ("spooled", "evicted", "lost", "dropped")
        undelivered = sum(s[k] for k in missing) + len(self._own_set_aside)
        return undelivered == 0 and self.spool.quarantined is None and self._status_delivered is not False

    # -- the thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            self.spool.open()
            # What `packscope sync` needs to register the run, should this process not deliver it.
            self.spool.set_meta(RUN_KEY, self.run_body)
        except SpoolError as exc:
            log.error("packscope: %s; records are sent without a spool, and lost when the server cannot take them", exc)
        while not self._stopping:
            try:
                self._wait_for_records()
                self._deliver()
                self.contact.tick(self._side_request)
            except Exception:  # noqa: BLE001 - the sender must never die; records stay spooled
                self._unexpected()
        self._finish()

    def _unexpected(self) -> None:
        self._say(
            logging.ERROR,
            "unexpected",
            "packscope sender: unexpected error; carrying on, undelivered records stay in the spool",
            exc_info=True,
        )
        self._iso.reset()
        self._not_before = max(self._not_before, time.monotonic() + self.retry_s)
        time.sleep(min(self.retry_s, IDLE_WAIT_S))  # no busy loop if the error repeats

    def _wait_for_records(self) -> None:
        """Block until records arrive, a retry is due or close() is called; spool what arrived."""
        wait = IDLE_WAIT_S
        # A spooled record is a reason to wake only where there is a server to send it to: offline,
        # waking for it would spin this thread, and its hold on the GIL between the trainer's
        # operations slows every step (issue 34; commit 00984b1 gives the HF Trainer's step times).
        if len(self.spool) and not self.offline:
            wait = min(wait, self._not_before - time.monotonic())
        try:
            first = self.queue.get(timeout=wait) if wait > 0 else self.queue.get_nowait()
        except queue.Empty:
            return
        self._take(first)

    def _spool_queued(self) -> None:
        """Move whatever waits in the queue to the spool, without blocking."""
        try:
            first = self.queue.get_nowait()
        except queue.Empty:
            return
        self._take(first)

    def _take(self, item: object) -> None:
        records: list[dict] = []
        while True:
            if item is _STOP:
                self._stopping = True
            else:
                records.append(item)  # type: ignore[arg-type]  # submit() only queues dicts
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
        self._keep(records)

    def _keep(self, records: list[dict]) -> None:
        """Commit records to the spool; those it cannot keep get one direct try, or are lost."""
        bodies = []
        for record in records:
            try:
                bodies.append(encode(record))
            except (TypeError, ValueError) as exc:
                self._lose(1, f"a record is not JSON ({exc})")
        if not bodies:
            return
        try:
            self.spool.append(bodies)
        except Exception as exc:  # noqa: BLE001 - SpoolError or not, these records were not kept
            self._send_unkept(bodies, exc)
            return
        self.kept += len(bodies)

    def _send_unkept(self, bodies: list[str], why: Exception) -> None:
        self._say(
            logging.ERROR,
            "unkept",
            "packscope: could not write %d interval records to the spool (%s); sending them without keeping them",
            len(bodies),
            why,
        )
        for start in range(0, len(bodies), self.config.batch_size):
            chunk = bodies[start : start + self.config.batch_size]
            if time.monotonic() < self._not_before:  # the server is failing too: no use trying
                self._lose(len(bodies) - start, f"not kept ({why}), and the server is not taking records")
                return
            try:
                self._count_delivery(self._post_intervals(chunk))
            except ServerError as exc:
                self._lose(len(bodies) - start, f"not kept ({why}), and not delivered ({exc})")
                self._back_off(exc)
                return

    def _lose(self, n: int, why: str) -> None:
        self.lost += n
        log.error("packscope: %d interval records lost: %s (%d lost in total)", n, why, self.lost)

    # -- delivery --------------------------------------------------------------------------------
    def _deliver(self) -> None:
        """Send the spool's oldest records for as long as the server takes them; once it has
        caught up, the set-aside records that are due for another try."""
        if self.offline:
            return
        while len(self.spool) and time.monotonic() >= self._not_before and not self._stopping:
            self._send_next()
            self._spool_queued()  # while a backlog replays, new records wait on disk, not in the queue
        now = time.monotonic()
        if not len(self.spool) and now >= max(self._not_before, self._set_aside_check_at) and not self._stopping:
            self._set_aside_check_at = now + min(SET_ASIDE_CHECK_S, self.config.set_aside_retry_s)
            self._retry_set_aside()

    def _retry_set_aside(self, retry_s: float | None = None) -> None:
        """Try due set-aside records again, one request each, while the server answers."""
        retry_s = self.config.set_aside_retry_s if retry_s is None else retry_s
        cfg = self.config
        while time.monotonic() >= self._not_before:
            try:
                due = self.spool.due_set_aside(1, retry_s, cfg.set_aside_max_attempts, cfg.set_aside_max_age_s)
            except SpoolError:
                return
            if not due:
                return
            try:
                counts = self._post_intervals([due[0].body])
            except ServerError as exc:
                if exc.registering or exc.kind in ("down", "auth", "throttled"):
                    self._back_off(exc)
                    return
                self.spool.failed_again(due, str(exc))
                continue
            self.spool.delivered_set_aside(due)
            self._own_set_aside.discard(due[0].id)
            self.recovered += 1
            self._count_delivery(counts)
            log.info("packscope: interval %s, set aside before, reached the server", _interval_of(due[0]))

    def _send_next(self) -> None:
        entries = self._next_request()
        if not entries:  # the spool's count and rows disagree (another process?): do not spin
            self._not_before = time.monotonic() + self.retry_s
            return
        try:
            counts = self._post_intervals([e.body for e in entries])
        except ServerError as exc:
            self._on_failure(entries, exc)
            return
        try:
            self.spool.ack(entries)  # before counting: `sent` never includes a record still spooled
        except SpoolError as exc:
            self._count_delivery(counts)
            self._say(
                logging.ERROR,
                "ack",
                "packscope: delivered %d records but could not delete them from the "
                "spool (%s); they will be sent again and counted as duplicates",
                len(entries),
                exc,
            )
            self._not_before = time.monotonic() + self.retry_s
            return
        self._count_delivery(counts)
        self._on_success()

    def _next_request(self) -> list[Entry]:
        iso = self._iso
        if iso.probing:
            after = self.spool.head(1, skip=1)
            if after:
                return after
            iso.probing = False  # nothing after the suspect yet: retry the suspect itself
        if iso.active:
            entries = [e for e in self.spool.head(iso.size) if e.id <= iso.until_id]  # type: ignore[operator]
            if entries:
                return entries
            iso.reset()  # the suspected batch is all delivered or set aside
        return self.spool.head(self.config.batch_size)

    def _count_delivery(self, counts: tuple[int, int]) -> None:
        self.sent += counts[0]
        self.duplicates += counts[1]

    def _on_success(self) -> None:
        iso = self._iso
        if iso.probing:
            iso.probing, iso.peer_ok = False, True  # give the suspect one last try
        else:
            iso.peer_ok, iso.attempts = False, 0
        self._failures, self._not_before = 0, 0.0
        if self.last_error is not None:
            log.info("packscope: the server takes records again (%d waiting in the spool)", len(self.spool))
            self.last_error = None

    def _on_failure(self, entries: list[Entry], exc: ServerError) -> None:
        if exc.registering or exc.kind in ("down", "auth", "throttled"):
            self._back_off(exc)  # nothing to do with these records: keep them and wait
        elif exc.kind == "refused":
            self._on_refused(entries, exc)
        else:
            self._on_failing(entries, exc)

    def _on_refused(self, entries: list[Entry], exc: ServerError) -> None:
        """4xx: the server will never take this batch. Halve it until the refused ones are alone."""
        if len(entries) > 1:
            self._iso.split(entries)  # the halves go out at once: a refusal is not worth waiting on
            return
        self._iso.probing = False  # a refused probe says nothing about the suspect
        self._set_aside(entries, "rejected", exc)

    def _on_failing(self, entries: list[Entry], exc: ServerError) -> None:
        """5xx: retry, then halve; set a record aside only when it fails alone and the next
        record goes through, so a server that fails every request never loses anything."""
        iso = self._iso
        if iso.probing:  # the record after the suspect fails too: it is the server, not the record
            iso.probing = False
            self._back_off(exc)
            return
        iso.start(entries)
        iso.attempts += 1
        if iso.attempts < self.config.max_attempts:
            self._back_off(exc)
        elif len(entries) > 1:
            iso.split(entries)
            self._failures = 0  # the halves are new requests: their retries start from retry_s
        elif iso.peer_ok:
            self._set_aside(entries, "poisoned", exc)
            iso.reset()
        elif len(self.spool) > 1:
            iso.probing = True  # this record, or the server? send the next record alone
        else:
            self._back_off(exc)  # nothing to compare with yet: wait, then try it again

    def _set_aside(self, entries: list[Entry], kind: str, exc: ServerError) -> None:
        self.spool.set_aside(entries, kind, str(exc))
        if kind == "rejected":  # the run page says how many intervals the server refused, and why
            for entry in entries:
                _report_refused(self.contact, entry, str(exc))
        self._own_set_aside.update(e.id for e in entries)
        if kind == "rejected":
            self.rejected += len(entries)
        else:
            self.poisoned += len(entries)
        intervals = ", ".join(str(_interval_of(e)) for e in entries)
        what = "refused" if kind == "rejected" else "keeps failing on"
        log.error(
            "packscope: the server %s interval %s (%s); set aside in %s (table set_aside) and tried "
            "again later, %d rejected and %d poisoned so far",
            what,
            intervals,
            exc,
            self.spool.path,
            self.rejected,
            self.poisoned,
        )

    def _back_off(self, exc: ServerError) -> None:
        """Wait our backoff, or the server's Retry-After when it asks for longer: never less, so
        a server that answers `Retry-After: 0` to every request is not flooded."""
        self._failures += 1
        now = time.monotonic()
        delay = Backoff(self.retry_s, max(self.retry_s, self.config.retry_max_s)).delay(self._failures, exc.retry_after)
        if exc.retry_after is not None:
            self._server_wait_until = now + min(exc.retry_after, RETRY_AFTER_CAP_S)
        self._not_before = now + delay
        self._report(exc, delay)

    def _report(self, exc: ServerError, delay: float) -> None:
        self.last_error = str(exc)
        waiting = f"{len(self.spool)} records wait in the spool {self.spool.path}"
        if exc.kind == "auth":
            self._say(
                logging.ERROR,
                str(exc),
                "packscope: the server refuses our token (%s). %s; they are "
                "sent once the token is fixed (an agent with the right token and the same run_id replays "
                "them)",
                exc,
                waiting,
            )
        elif exc.registering and exc.kind == "refused":
            self._say(
                logging.ERROR,
                str(exc),
                "packscope: the server refuses to register run %s (%s). %s",
                self.run_id,
                exc,
                waiting,
            )
        elif exc.kind == "throttled":
            self._say(
                logging.WARNING, str(exc), "packscope: the server asks us to wait %.3g s (%s). %s", delay, exc, waiting
            )
        else:
            what = "is not reachable" if exc.status is None else "failed a request"
            self._say(
                logging.WARNING,
                str(exc),
                "packscope: the server %s (%s). %s; next try in %.3g s",
                what,
                exc,
                waiting,
                delay,
            )

    def _say(self, level: int, topic: str, msg: str, *args: object, exc_info: bool = False) -> None:
        """Log, but the same topic at most once per LOG_REPEAT_S."""
        now = time.monotonic()
        if now - self._last_logged.get(topic, -math.inf) >= LOG_REPEAT_S:
            self._last_logged[topic] = now
            log.log(level, msg, *args, exc_info=exc_info)

    # -- HTTP ------------------------------------------------------------------------------------
    def _post_intervals(self, bodies: list[str]) -> tuple[int, int]:
        """POST spooled JSON bodies as one batch (joined, never re-parsed); (accepted, duplicates)."""
        data = ('{"intervals":[' + ",".join(bodies) + "]}").encode()
        path = f"/api/v1/runs/{urllib.parse.quote(self.run_id, safe='')}/intervals"
        if not self._run_registered:
            self._register()
        try:
            answer = self._request("POST", path, data)
        except ServerError as exc:
            if exc.status != 404:
                raise
            # The server came back without our run (a new database): register again (idempotent).
            self._register()
            answer = self._request("POST", path, data)
        self._warn_ignored(answer)
        return _ingest_counts(answer)

    def _warn_ignored(self, answer: object) -> None:
        """Fields the server's record does not know (a misspelt field, a server older than this
        agent) are named in its answer: said once per run, so the records' gap is not silent."""
        ignored = answer.get("ignored") if isinstance(answer, dict) else None
        new = sorted(set(ignored or ()) - self._ignored_fields)
        if new:
            self._ignored_fields.update(new)
            log.warning(
                "packscope: the server at %s does not know the record field(s) %s and does not store them; "
                "a misspelt field, or a server older than this agent (upgrade it)",
                self.base,
                ", ".join(new),
            )

    def _side_request(self, method: str, path: str, body: dict) -> object:
        """A small request about the run (agent/contact.py: heartbeat, PATCH, refusals), after
        registering it; a server that lost the run gets it registered again."""
        if not self._run_registered:
            self._register()
        url = f"/api/v1/runs/{urllib.parse.quote(self.run_id, safe='')}{path}"
        data = json.dumps(body, default=str).encode()
        try:
            return self._request(method, url, data)
        except ServerError as exc:
            if exc.status != 404:
                raise
            self._register()
            return self._request(method, url, data)

    def _register(self) -> None:
        try:
            self._request("POST", "/api/v1/runs", json.dumps(self.run_body, default=str).encode())
        except ServerError as exc:
            exc.registering = True
            raise
        self._run_registered = True

    def _request(self, method: str, path: str, data: bytes) -> object:
        timeout = min(self.config.request_timeout_s, max(0.05, self._deadline - time.monotonic()))
        try:
            return self._client.request(method, path, data, timeout_s=timeout)[1]
        except HttpError as err:
            kind = "down" if err.invalid_answer else None  # a 2xx that is not JSON: maybe stored, keep
            raise ServerError(str(err), err.status, err.retry_after, kind) from None

    # -- closing ---------------------------------------------------------------------------------
    def _finish(self) -> None:
        try:
            if self.offline:
                self._spool_queued()
                self._keep_final_status()
            else:
                self._deliver_until_deadline()
                if time.monotonic() < self._deadline:
                    self.contact.flush(self._side_request)
                self._send_final_status()
        except Exception:
            log.exception("packscope sender: unexpected error while closing")
        finally:
            self.spool.close(remove_if_empty=not self.offline)
            self._summarize()

    def _keep_final_status(self) -> None:
        """The final status, for `packscope sync` to set once it has delivered the records."""
        if self._final_patch is None:
            return
        try:
            self.spool.set_meta(FINAL_KEY, self._final_patch)
        except SpoolError as exc:
            self._status_delivered = False
            log.error("packscope: could not keep the run's final status in the spool: %s", exc)

    def _deliver_until_deadline(self) -> None:
        # A last try now, whatever our own backoff says; a server's Retry-After is still honoured.
        self._not_before = self._server_wait_until
        while True:
            try:
                self._spool_queued()
                now = time.monotonic()
                if not len(self.spool) or max(now, self._not_before) >= self._deadline:
                    return
                if self._not_before > now:
                    time.sleep(self._not_before - now)
                self._send_next()
            except Exception:  # noqa: BLE001
                self._unexpected()

    def _send_final_status(self) -> None:
        if self._final_patch is None:
            return
        if time.monotonic() >= self._deadline:  # no time left to send it: keep it for `packscope sync`
            self._status_delivered = False
            self._keep_final_status()
            return
        try:
            if not self._run_registered:
                self._register()
            path = f"/api/v1/runs/{urllib.parse.quote(self.run_id, safe='')}"
            self._request("PATCH", path, json.dumps(self._final_patch, default=str).encode())
        except ServerError as exc:
            self._status_delivered = False
            log.warning("packscope: could not set the run's final status: %s; `packscope sync` sets it later", exc)
            self._keep_final_status()
            return
        self._status_delivered = True
        try:
            if self.spool.meta(FINAL_KEY) is not None:  # an earlier process's, now superseded
                self.spool.set_meta(FINAL_KEY, None)
        except SpoolError:
            pass  # at worst a later `packscope sync` sets the status again

    def _summarize(self) -> None:
        if self.offline and self._all_delivered():
            log.info(
                "packscope: offline run %s: %d records kept in %s; send them with `packscope sync %s --server URL`",
                self.run_id,
                len(self.spool),
                self.spool.path,
                self.spool.path.parent,
            )
            return
        if self._all_delivered():
            return
        s = self.stats()
        log.warning(
            "packscope: not everything reached the server: %s%s",
            ", ".join(f"{k} {v}" for k, v in s.items()),
            f"; {s['spooled']} records stay in {self.spool.path}: `packscope sync {self.spool.path} --server URL` "
            "sends them (as does an agent started with the same run_id)"
            if s["spooled"]
            else "",
        )


def _report_refused(contact: RunContact, entry: Entry, reason: str) -> None:
    try:
        record = entry.record
        keys = {k: int(record[k]) for k in ("interval", "rank", "first_step", "last_step")}
    except (ValueError, AttributeError, KeyError, TypeError):
        return  # not a record the server could name either
    contact.refuse({**keys, "by": "server", "reason": reason})


def _interval_of(entry: Entry) -> object:
    try:
        return entry.record.get("interval", "?")
    except (ValueError, AttributeError):
        return "?"
