"""Exact sync counting through CUPTI (optional extra ``packscope[cupti]``).

Counts every driver call that makes the host wait for the device: context, stream and event
synchronize, and the synchronous memcpy entry points. Nothing is inferred from PyTorch's
warnings, so syncs made by other libraries (NCCL, cuBLAS workspace setup, Triton autotuning,
your own extensions) are counted too. CUPTI allows one subscriber per process: when
torch.profiler, Nsight or another tool holds it, installing fails with a message saying so.
"""

from __future__ import annotations

from packscope.agent.syncs import SyncCounter, caller_site

# Driver entry points that block the calling host thread until device work completes.
BLOCKING_DRIVER_CALLS = (
    "cuCtxSynchronize", "cuCtxSynchronize_v2",
    "cuStreamSynchronize", "cuStreamSynchronize_ptsz",
    "cuEventSynchronize",
    "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2", "cuMemcpyDtoD_v2", "cuMemcpy", "cuMemcpy_ptds",
)


class CuptiUnavailable(RuntimeError):
    pass


class CuptiSyncCounter(SyncCounter):
    def __init__(self) -> None:
        super().__init__()
        self._cupti = None
        self._subscriber = None

    def _callback(self, userdata, domain, cbid, cbdata) -> None:
        if cbdata.callback_site == self._cupti.ApiCallbackSite.API_ENTER:
            self.record(caller_site())

    def install(self) -> CuptiSyncCounter:
        if self.installed:
            return self
        try:
            from cupti import cupti
        except ImportError as exc:
            raise CuptiUnavailable(
                "sync_backend='cupti' needs cupti-python built for the CUDA of your torch "
                f"(torch.version.cuda); install it with pip install 'cupti-python==<major>.*' ({exc})"
            ) from None
        self._cupti = cupti
        params = cupti.SubscriberParams()
        params.struct_size = cupti.SUBSCRIBER_PARAMS_SIZE
        params.subscriber_name = "packscope"
        try:
            self._subscriber = cupti.subscribe_v2(self._callback, None, params.ptr)
        except cupti.cuptiError as exc:
            if exc.status == cupti.Result.ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED:
                raise CuptiUnavailable(
                    f"CUPTI already has a subscriber ({params.old_subscriber_name or 'another profiler'}); "
                    "CUPTI allows one per process. Stop torch.profiler/Nsight for this run, or use "
                    "sync_backend='debug-mode'"
                ) from None
            raise CuptiUnavailable(f"CUPTI refused the subscription: {cupti.Result(exc.status).name}") from None
        for name in BLOCKING_DRIVER_CALLS:
            cbid = getattr(cupti.driver_api_trace_cbid, name, None)
            if cbid is not None:
                cupti.enable_callback(1, self._subscriber, cupti.CallbackDomain.DRIVER_API, cbid)
        self.installed = True
        return self

    def uninstall(self) -> None:
        if self.installed:
            self._cupti.unsubscribe(self._subscriber)
            self.installed = False
