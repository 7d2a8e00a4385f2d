"""Exact sync counting through CUPTI (optional extra ``packscope[cupti]``).

Counts every driver call that makes the host wait for the device: context, stream and event
synchronize, the synchronous memcpy entry points, and an *asynchronous* device-to-host copy
whose destination is pageable (not pinned) host memory, which the driver can only complete by
waiting for the device: ``cpu_tensor.copy_(gpu_tensor, non_blocking=True)`` into an ordinary
CPU tensor. Nothing is inferred from PyTorch's warnings, so syncs made by other libraries
(NCCL, cuBLAS workspace setup, Triton autotuning, your own extensions) are counted too. CUPTI
allows one subscriber per process: when torch.profiler, Nsight or another tool holds it,
installing fails with a message saying so.

The same subscription lends its CUPTI to an ``IdleTracer``: the activity records (kernels,
copies, memsets, synchronizations) of a few steps of a sampled interval, from which
agent/gpu_idle.py prices the syncs and the host-/launch-bound idle. Activity is enabled only
for those steps and read back (``activity_flush_all``) once the interval's events have
completed, so every record of the traced steps is in, and nothing waits for the GPU.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from typing import Any

from packscope.agent.gpu_idle import Busy, HostSync
from packscope.agent.sync_sites import caller_site
from packscope.agent.syncs import SyncCounter

# Driver entry points that block the calling host thread until device work completes.
BLOCKING_DRIVER_CALLS = (
    "cuCtxSynchronize",
    "cuCtxSynchronize_v2",
    "cuStreamSynchronize",
    "cuStreamSynchronize_ptsz",
    "cuEventSynchronize",
    "cuMemcpyDtoH_v2",
    "cuMemcpyHtoD_v2",
    "cuMemcpyDtoD_v2",
    "cuMemcpy",
    "cuMemcpy_ptds",
)
# Asynchronous copies that block only when they write device data to pageable host memory.
# Their parameter structs start with (dst, src); cudaMemcpyAsync arrives as cuMemcpyAsync.
ASYNC_COPY_CALLS = (
    "cuMemcpyAsync",
    "cuMemcpyAsync_ptsz",
    "cuMemcpyDtoHAsync_v2",
    "cuMemcpyDtoHAsync_v2_ptsz",
)
log = logging.getLogger("packscope.agent")
# CUpti_CallbackData: callbackSite (4 bytes + 4 of padding), functionName, functionParams...
_FUNCTION_PARAMS_OFFSET = 16
_CU_POINTER_ATTRIBUTE_MEMORY_TYPE = 2
_CU_MEMORYTYPE_DEVICE = 2


def _memory_type(driver: ctypes.CDLL, address: int) -> int | None:
    """CUmemorytype of an address, or None for pageable host memory the driver does not know."""
    kind = ctypes.c_uint(0)
    status = driver.cuPointerGetAttribute(
        ctypes.byref(kind), _CU_POINTER_ATTRIBUTE_MEMORY_TYPE, ctypes.c_uint64(address)
    )
    return kind.value if status == 0 else None


class CuptiUnavailable(RuntimeError):
    pass


class CuptiSyncCounter(SyncCounter):
    """Counts through the process's one CUPTI subscription, shared with every other installed
    CuptiSyncCounter: CUPTI allows one subscriber, and two agents in one process (a notebook, a
    sweep) may overlap in any order, or one never be closed."""

    def _counting_switched(self, on: bool) -> None:
        pass  # the callback reads `counting`: CUPTI itself stays subscribed

    def install(self) -> CuptiSyncCounter:
        global _subscription
        if self.installed:
            return self
        with _subscription_lock:
            if _subscription is None:
                _subscription = _Subscription(_import_cupti())
            _subscription.counters = (*_subscription.counters, self)
        self.installed = True
        return self

    def uninstall(self) -> None:
        global _subscription
        if not self.installed:
            return
        with _subscription_lock:
            assert _subscription is not None  # an installed counter holds it
            _subscription.counters = tuple(c for c in _subscription.counters if c is not self)
            if not _subscription.counters:
                _subscription.close()
                _subscription = None
        self.installed = False


def _import_cupti() -> Any:
    try:
        from cupti import cupti
    except ImportError as exc:
        raise CuptiUnavailable(
            "sync_backend='cupti' needs cupti-python built for the CUDA of your torch "
            f"(torch.version.cuda); install it with pip install 'cupti-python==<major>.*' ({exc})"
        ) from None
    return cupti


class _Subscription:
    """The CUPTI subscriber and its callback, counting into every installed counter."""

    def __init__(self, cupti: Any) -> None:
        # Replaced, never mutated: the callback reads it without the lock.
        self.counters: tuple[CuptiSyncCounter, ...] = ()
        self._cupti = cupti  # the cupti module (it ships no types)
        self.tracer: IdleTracer | None = None  # made by idle_tracer() on first use
        self._driver = ctypes.CDLL("libcuda.so.1")
        self._async_copy_cbids: set[int] = set()
        self._stream_sync_cbids: set[int] = set()
        self._last = threading.local()  # per thread: the site of a blocking copy just counted
        self._warned = False
        self._subscriber = self._subscribe(cupti)
        for name in BLOCKING_DRIVER_CALLS + ASYNC_COPY_CALLS:
            cbid = getattr(cupti.driver_api_trace_cbid, name, None)
            if cbid is not None:
                if name in ASYNC_COPY_CALLS:
                    self._async_copy_cbids.add(int(cbid))
                elif name.startswith("cuStreamSynchronize"):
                    self._stream_sync_cbids.add(int(cbid))
                cupti.enable_callback(1, self._subscriber, cupti.CallbackDomain.DRIVER_API, cbid)

    def close(self) -> None:
        if self.tracer is not None:
            try:
                self.tracer.stop()
                self._cupti.activity_flush_all(1)  # into the tracer: an agent's last trace reads them
            except self._cupti.cuptiError as exc:
                log.warning("packscope: CUPTI's activity tracing did not stop cleanly (%s)", exc)
        self._cupti.unsubscribe(self._subscriber)

    def _record(self, site: str) -> None:
        for counter in self.counters:
            counter.record(site)

    def _callback(self, userdata, domain, cbid, cbdata) -> None:
        counters = self.counters
        if not any(c.counting for c in counters) or cbdata.callback_site != self._cupti.ApiCallbackSite.API_ENTER:
            return
        cbid = int(cbid)
        copy_site, self._last.copy_site = getattr(self._last, "copy_site", None), None
        if cbid in self._async_copy_cbids:
            if self._blocking_async_copy(cbdata):
                site = caller_site()
                self._record(site)
                self._last.copy_site = site
            return
        site = caller_site()
        if cbid in self._stream_sync_cbids and site == copy_site:
            # PyTorch's blocking copies (.item(), .tolist(), .cpu()) are an async copy to
            # pageable memory followed at once by a stream synchronize: one wait, counted once.
            return
        self._record(site)

    def _blocking_async_copy(self, cbdata) -> bool:
        """Device data to pageable host memory: the call returns only when the copy is done."""
        try:
            params = ctypes.c_void_p.from_address(cbdata.ptr + _FUNCTION_PARAMS_OFFSET).value
            if params is None:
                return False
            dst = ctypes.c_uint64.from_address(params).value
            src = ctypes.c_uint64.from_address(params + 8).value
            return _memory_type(self._driver, dst) is None and _memory_type(self._driver, src) == _CU_MEMORYTYPE_DEVICE
        except Exception as exc:  # noqa: BLE001 - an exception must not escape into the driver
            if not self._warned:
                self._warned = True
                log.warning(
                    "packscope: CUPTI could not read an async copy's parameters (%s); "
                    "copies to pageable memory are not counted",
                    exc,
                )
            return False

    def _subscribe(self, cupti) -> int:
        """A CUPTI subscriber handle, with a message naming whoever holds CUPTI when it is taken.

        ``subscribe_v2`` names the other subscriber, but its parameter struct grows between
        releases: cupti-python 13.4 sends a struct that the libcupti torch already loaded (13.0,
        the same soname) refuses with ERROR_INVALID_PARAMETER. The plain ``subscribe`` takes no
        struct and works with every release.
        """
        params = cupti.SubscriberParams()
        params.struct_size = cupti.SUBSCRIBER_PARAMS_SIZE
        params.subscriber_name = "packscope"
        try:
            return cupti.subscribe_v2(self._callback, None, params.ptr)
        except cupti.cuptiError as exc:
            status = exc.status
            if status == cupti.Result.ERROR_INVALID_PARAMETER:
                log.info("packscope: CUPTI refused subscribe_v2's parameters; subscribing without them")
                try:
                    return cupti.subscribe(self._callback, None)
                except cupti.cuptiError as plain:
                    status = plain.status
            if status == cupti.Result.ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
                holder = getattr(params, "old_subscriber_name", None) or "another profiler"
                raise CuptiUnavailable(
                    f"CUPTI already has a subscriber ({holder}); CUPTI allows one per process. "
                    "Stop torch.profiler/Nsight for this run, or use sync_backend='debug-mode'"
                ) from None
            raise CuptiUnavailable(f"CUPTI refused the subscription: {cupti.Result(status).name}") from None


# CUpti_ActivityMemcpyKind DTOH, CUpti_ActivityMemoryKind PAGEABLE, and the synchronization type
# that does not block the host (a stream waiting for an event), as CUPTI's headers number them.
_MEMCPY_DTOH = 2
_MEMORY_PAGEABLE = 1
_SYNC_STREAM_WAIT_EVENT = 2
ACTIVITY_BUFFER_BYTES = 8 << 20


class IdleTracer:
    """The GPU activity of traced steps, through the process's CUPTI (held by an installed
    CuptiSyncCounter). ``start``/``stop`` bracket the traced steps on the host (the activity API's
    enable and disable: no device work); ``take`` flushes the records once the steps' GPU work
    has completed and hands them over as gpu_idle's Busy and HostSync records."""

    def __init__(self, cupti: Any) -> None:
        self._cupti = cupti
        self._kinds = [
            getattr(cupti.ActivityKind, name)
            for name in ("CONCURRENT_KERNEL", "MEMCPY", "MEMSET", "SYNCHRONIZATION")
            if hasattr(cupti.ActivityKind, name)
        ]
        self._lock = threading.Lock()
        self._busy: list[Busy] = []
        self._syncs: list[HostSync] = []
        self.dropped = 0  # records of a kind this reader does not know, or unreadable
        self.on = False  # the activity kinds are enabled (between start and stop)
        cupti.activity_register_callbacks(self._buffer_requested, self._buffer_completed)

    def timestamp(self) -> int:
        """Now, on the clock of the activity records (ns)."""
        return int(self._cupti.get_timestamp())

    def start(self) -> None:
        self.on = True
        for kind in self._kinds:
            self._cupti.activity_enable(kind)

    def stop(self) -> None:
        if not self.on:
            return
        self.on = False
        for kind in self._kinds:
            self._cupti.activity_disable(kind)

    def take(self) -> tuple[list[Busy], list[HostSync]]:
        """Every record delivered since the last take; call it once the traced steps' events
        have completed (their GPU work is done, so their records are complete)."""
        self._cupti.activity_flush_all(0)
        return self.delivered()

    def delivered(self) -> tuple[list[Busy], list[HostSync]]:
        """The records delivered so far, without a flush (after the subscription's last one)."""
        with self._lock:
            busy, syncs = self._busy, self._syncs
            self._busy, self._syncs = [], []
        return busy, syncs

    @staticmethod
    def _buffer_requested() -> tuple[int, int]:
        return ACTIVITY_BUFFER_BYTES, 0

    def _buffer_completed(self, activities: list) -> None:
        kinds = self._cupti.ActivityKind
        busy: list[Busy] = []
        syncs: list[HostSync] = []
        for a in activities:
            try:
                kind = a.kind
                if not a.start or a.end <= a.start:  # not timed (a record flushed before it completed)
                    self.dropped += 1
                    continue
                if kind == kinds.MEMCPY:
                    to_host = getattr(a, "copy_kind", None) == _MEMCPY_DTOH
                    blocking = to_host and getattr(a, "dst_kind", None) == _MEMORY_PAGEABLE
                    busy.append(Busy(int(a.start), int(a.end), blocking))
                elif kind == getattr(kinds, "SYNCHRONIZATION", None):
                    if getattr(a, "type", None) != _SYNC_STREAM_WAIT_EVENT:  # a stream's wait blocks no host
                        syncs.append(HostSync(int(a.start), int(a.end)))
                else:
                    busy.append(Busy(int(a.start), int(a.end)))
            except Exception:  # noqa: BLE001 - an exception must not escape into CUPTI
                self.dropped += 1
        with self._lock:
            self._busy += busy
            self._syncs += syncs


def idle_tracer() -> IdleTracer | None:
    """The process's IdleTracer, made on first use, while a CuptiSyncCounter holds CUPTI; None
    without one (the debug-mode backend: CUPTI is not ours to use)."""
    with _subscription_lock:
        if _subscription is None:
            return None
        if _subscription.tracer is None:
            _subscription.tracer = IdleTracer(_subscription._cupti)
        return _subscription.tracer


_subscription_lock = threading.Lock()
_subscription: _Subscription | None = None
