"""The agent's settings: one small dataclass, everything else has a sensible default."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from packscope.core.http_client import Backoff
from packscope.core.spool import DEFAULT_SPOOL_DIR, SET_ASIDE_MAX_AGE_S, SET_ASIDE_MAX_ATTEMPTS, SET_ASIDE_RETRY_S
from packscope.core.urls import checked_server_url

__all__ = ["DEFAULT_SPOOL_DIR", "AgentConfig"]  # the spool directory's default, read by agent.py and sender.py
_BACKOFF = Backoff()  # the one backoff policy of the sender, `packscope import` and `packscope sync`


@dataclass
class AgentConfig:
    # e.g. "http://127.0.0.1:8000". None: send nothing; with a spool_dir, the run is kept there
    # (offline: records, registration, final status) for `packscope sync DIR --server URL`.
    server: str | None = None
    run_name: str = "run"
    project: str = "default"
    # The layout the run declares: "thd" (packed, per-document attention) or "bshd" (padded rows).
    # None: registered as "thd" until the batches say otherwise. Either way the agent reports the
    # layout its batches had (bshd, thd, thd-static, mixed), and warns when it differs from this.
    layout: str | None = None
    log_every: int = 10  # steps per interval record
    run_id: str | None = None  # give one to resume a run; None: made from the name and time
    # Resuming from a checkpoint: the last step the checkpoint holds. Steps then continue from
    # start_step + 1 and interval indexes from start_step // log_every, so the resumed intervals
    # do not collide with the ones the server already stored.
    start_step: int = 0
    token: str | None = None  # bearer token for the server's ingest endpoints
    tags: list[str] = field(default_factory=list)
    config: dict[str, Any] = field(default_factory=dict)  # the trainer's own config, stored as-is
    peak_tflops: float | None = None  # None: looked up from the GPU name (dense bf16)
    parallel: dict[str, int] = field(default_factory=dict)  # dp/tp/pp/cp/ep sizes, for display
    count_syncs: bool = True
    # Host syncs are counted over one interval in this many (1: every interval), besides the
    # process's first two: a sync counted in debug mode costs the trainer tens of µs in PyTorch's
    # warning path (docs/agent.md, "Host synchronizations"). The records say which steps went
    # uncounted.
    count_syncs_every: int = 8
    sample_gpu: bool = True  # NVML telemetry when nvidia-ml-py is installed and the device is CUDA
    sync_backend: str = "debug-mode"  # "debug-mode" (default) or "cupti" (exact, optional extra)
    # With sync_backend="cupti": steps of each interval whose syncs are counted (from its second
    # step) that CUPTI's activity API traces, to price the syncs and the host-/launch-bound idle
    # (docs/ledger.md); 0: none.
    trace_idle_steps: int = 3
    # Delivery (docs/agent.md, "Delivery"): every record is committed to a spool file,
    # <spool_dir>/<run_id>.sqlite, before it is sent, and deleted once the server has it.
    spool_dir: str | None = None  # None: DEFAULT_SPOOL_DIR
    spool_max_bytes: int = 256 * 1024 * 1024  # the oldest records are evicted (and counted) past this
    queue_size: int = 4096  # records waiting for the sender thread; more are dropped (and counted)
    batch_size: int = 64  # records per HTTP request
    request_timeout_s: float = 5.0
    retry_s: float = _BACKOFF.base_s  # wait after a failed request; doubles with each failure in a row...
    retry_max_s: float = _BACKOFF.max_s  # ...up to this. A longer Retry-After (429, 503) waits longer.
    # 5xx answers to the same request before it is split in halves to find the record(s) the
    # server keeps failing on; such a record is set aside once the one after it goes through.
    max_attempts: int = 3
    # Liveness: rank 0 tells the server it is alive every heartbeat_s seconds (0: never), from the
    # sender thread; the server shows a run stale after 3 missed beats and crashed after 10. The
    # default is PACKSCOPE_HEARTBEAT_S when set (a trainer that builds its own config), else 30.
    heartbeat_s: float = field(default_factory=lambda: _env_seconds("PACKSCOPE_HEARTBEAT_S", 30.0))
    # On SIGTERM and on an unhandled exception, mark the run "failed" (the trainer's own SIGTERM
    # handler and excepthook still run after ours).
    mark_failed_on_exit: bool = True
    # The pack length of a packer whose packs the model receives flattened into one row (TRL's
    # packing with max_length, a padding-free collator of packs): the baseline then counts each row
    # of L tokens as ceil(L / pack_length) packs of pack_length, as a user of that packer counts
    # them. None: each row the model runs is one pack. `pack_length_from` says where it came from.
    pack_length: int | None = None
    pack_length_from: str | None = None
    # Set-aside records are tried again, alone: first this long after, then at twice the wait...
    set_aside_retry_s: float = SET_ASIDE_RETRY_S
    set_aside_max_attempts: int = SET_ASIDE_MAX_ATTEMPTS  # ...for this many failed tries in all...
    set_aside_max_age_s: float = SET_ASIDE_MAX_AGE_S  # ...within this long of being set aside.

    def __post_init__(self) -> None:
        if self.layout not in (None, "thd", "bshd"):
            raise ValueError(f"layout must be 'thd', 'bshd' or None (found in the batches), got {self.layout!r}")
        if self.server is not None:
            self.server = checked_server_url(self.server)
        if self.pack_length is not None and (not isinstance(self.pack_length, int) or self.pack_length < 1):
            raise ValueError(f"pack_length must be a positive number of tokens, got {self.pack_length!r}")
        if not self.heartbeat_s >= 0:
            raise ValueError(f"heartbeat_s must be >= 0 (0: no heartbeat), got {self.heartbeat_s}")
        if self.start_step < 0:
            raise ValueError(f"start_step must be >= 0, got {self.start_step}")
        if self.log_every < 1:
            raise ValueError(f"log_every must be >= 1, got {self.log_every}")
        if self.sync_backend not in ("debug-mode", "cupti"):
            raise ValueError(f"sync_backend must be 'debug-mode' or 'cupti', got {self.sync_backend!r}")
        if self.trace_idle_steps < 0:
            raise ValueError(f"trace_idle_steps must be >= 0, got {self.trace_idle_steps}")
        for name in (
            "count_syncs_every",
            "spool_max_bytes",
            "queue_size",
            "batch_size",
            "max_attempts",
            "set_aside_max_attempts",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("request_timeout_s", "retry_s", "retry_max_s", "set_aside_retry_s", "set_aside_max_age_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")


def _env_seconds(name: str, default: float) -> float:
    text = os.environ.get(name)
    if text is None:
        return default
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"{name} must be a number of seconds, got {text!r}") from None
