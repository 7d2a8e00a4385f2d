"""The sender thread: takes interval records off the trainer's hands and gets them to the server.

The trainer only ever calls ``submit`` (a non-blocking queue put). This thread batches records,
POSTs them gzip-compressed, and on any failure moves them to the on-disk spool, replaying the
spool in order before anything newer once the server answers again. The server treats
(run, rank, interval) as an idempotency key, so a replay never duplicates. Nothing here raises
into the training loop.
"""

from __future__ import annotations

import gzip
import json
import logging
import queue
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from packscope.agent.spool import Spool

log = logging.getLogger("packscope.agent")
_STOP = object()


class ServerError(Exception):
    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status  # the HTTP status, None when no answer came

    @property
    def rejected(self) -> bool:
        """The server answered and refused the request itself: retrying cannot help."""
        return self.status is not None and 400 <= self.status < 500 and self.status not in (404, 408, 429)


class Sender:
    def __init__(
        self,
        server: str,
        run_id: str,
        run_body: dict,
        spool_path: Path,
        *,
        token: str | None = None,
        queue_size: int = 4096,
        batch_size: int = 64,
        timeout_s: float = 5.0,
        spool_max_bytes: int = 256 * 1024 * 1024,
        retry_s: float = 2.0,
    ) -> None:
        self.base = server.rstrip("/")
        self.run_id = run_id
        self.run_body = run_body
        self.token = token
        self.batch_size = batch_size
        self.timeout_s = timeout_s
        self.retry_s = retry_s
        self.spool = Spool(spool_path, spool_max_bytes)
        self.queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self.sent = 0
        self.duplicates = 0
        self.dropped = 0  # records refused because the queue was full (reported, not silent)
        self.rejected = 0  # records the server refused (4xx), set aside in rejected_path
        self.rejected_path = spool_path.with_suffix(".rejected.jsonl")
        self.last_error: str | None = None
        self._run_registered = False
        self._final_patch: dict | None = None
        self._thread = threading.Thread(target=self._loop, name="packscope-sender", daemon=True)
        self._thread.start()

    # -- trainer side (never blocks, never raises) ----------------------------------------------
    def submit(self, record: dict) -> None:
        try:
            self.queue.put_nowait(record)
        except queue.Full:
            self.dropped += 1
            if self.dropped == 1 or self.dropped % 100 == 0:
                log.warning("packscope sender queue full: %d interval records dropped", self.dropped)

    def close(self, patch: dict | None, timeout_s: float = 30.0) -> bool:
        """Send what is queued (and the run's final status); True when everything reached the server."""
        self._final_patch = patch
        try:
            self.queue.put(_STOP, timeout=timeout_s)
        except queue.Full:
            return False
        self._thread.join(timeout_s)
        return not self._thread.is_alive() and len(self.spool) == 0

    # -- HTTP ------------------------------------------------------------------------------
    def _request(self, method: str, path: str, body: dict) -> dict:
        data = gzip.compress(json.dumps(body, separators=(",", ":")).encode())
        headers = {"Content-Type": "application/json", "Content-Encoding": "gzip"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.base + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as resp:
                return json.loads(resp.read() or b"{}")
        except urllib.error.HTTPError as exc:
            detail = exc.read()[:500].decode(errors="replace")
            raise ServerError(f"{method} {path}: HTTP {exc.code}: {detail}", exc.code) from None
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise ServerError(f"{method} {path}: {exc}") from None

    def _post_batch(self, records: list[dict]) -> None:
        if not self._run_registered:
            self._request("POST", "/api/v1/runs", self.run_body)
            self._run_registered = True
        path = f"/api/v1/runs/{self.run_id}/intervals"
        try:
            resp = self._request("POST", path, {"intervals": records})
        except ServerError as exc:
            if exc.status != 404:
                raise
            # The server came back without our run (a new database): register again (idempotent).
            self._request("POST", "/api/v1/runs", self.run_body)
            resp = self._request("POST", path, {"intervals": records})
        self.sent += int(resp.get("accepted", 0))
        self.duplicates += int(resp.get("duplicates", 0))

    # -- the thread ------------------------------------------------------------------------
    def _drain_queue(self, first, limit: int) -> tuple[list[dict], bool]:
        batch, stop = ([] if first is _STOP else [first]), first is _STOP
        while not stop and len(batch) < limit:
            try:
                item = self.queue.get_nowait()
            except queue.Empty:
                break
            if item is _STOP:
                stop = True
            else:
                batch.append(item)
        return batch, stop

    def _flush_spool(self) -> bool:
        """Replay the spool in order; True when it is empty."""
        while True:
            chunk = self.spool.peek(self.batch_size)
            if not chunk:
                return True
            try:
                self._post_batch(chunk)
            except ServerError as exc:
                if not exc.rejected:
                    self._note_error(exc)
                    return False
                self._set_aside(chunk, exc)
            self.spool.drop_front(len(chunk))

    def _note_error(self, exc: ServerError) -> None:
        msg = str(exc)
        if msg != self.last_error:
            what = "not reachable" if exc.status is None else f"answered HTTP {exc.status}"
            log.warning("packscope: server %s, spooling records to %s (%s)", what, self.spool.path, msg)
        self.last_error = msg

    def _set_aside(self, records: list[dict], exc: ServerError) -> None:
        """Records the server refuses (4xx) go to a side file, so they never block the rest."""
        self.rejected += len(records)
        with self.rejected_path.open("a") as f:
            f.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in records)
        log.error("packscope: the server refused %d interval records (%s); kept in %s",
                  len(records), exc, self.rejected_path)

    def _send(self, batch: list[dict]) -> None:
        if batch and len(self.spool) == 0:
            try:
                self._post_batch(batch)
                self.last_error = None
                return
            except ServerError as exc:
                if exc.rejected:
                    self._set_aside(batch, exc)
                    return
                self._note_error(exc)
        if batch:
            self.spool.append(batch)  # keep order: newer records queue up behind the spool
        self._flush_spool()

    def _loop(self) -> None:
        stop = False
        while not stop:
            try:
                first = self.queue.get(timeout=self.retry_s)
            except queue.Empty:
                if len(self.spool):
                    self._flush_spool()
                continue
            batch, stop = self._drain_queue(first, self.batch_size)
            try:
                self._send(batch)
            except Exception:  # noqa: BLE001 - the sender must never die and lose records
                log.exception("packscope sender: unexpected error; records kept in the spool")
        self._finish()

    def _finish(self) -> None:
        if len(self.spool) and not self._flush_spool():
            log.warning(
                "packscope: %d interval records stay in %s; an agent resumed with the same run_id "
                "replays them", len(self.spool), self.spool.path,
            )
            return
        if self._final_patch is not None:
            try:
                if not self._run_registered:
                    self._request("POST", "/api/v1/runs", self.run_body)
                self._request("PATCH", f"/api/v1/runs/{self.run_id}", self._final_patch)
            except ServerError as exc:
                log.warning("packscope: could not set the run's final status: %s", exc)
