"""One builder of wire interval records for the page and browser tests (pytest puts tests/ on
the path): every pack holds the same documents, so every field follows from the layout and the
record is consistent with itself (histograms, sums, counts)."""

from typing import Any

from packscope.core.histograms import NUM_BUCKETS, bucket_of


def packed_interval(
    k: int,
    *,
    steps: int = 10,
    pack: int = 4096,
    docs_per_pack: int = 8,
    doc_len: int = 512,
    gpu_time_s: float = 0.5,
    syncs_per_step: int = 3,
    syncs_counted: bool = True,
    loss: float | None = None,
    gpu: dict[str, float] | None = None,
) -> dict[str, Any]:
    """Interval k of rank 0: `steps` steps of one pack each, `docs_per_pack` documents of `doc_len`."""
    if docs_per_pack * doc_len > pack:
        raise ValueError("the documents do not fit in the pack")
    real = steps * docs_per_pack * doc_len
    documents = {"count": [0] * NUM_BUCKETS, "tokens": [0] * NUM_BUCKETS}
    documents["count"][bucket_of(doc_len)] = steps * docs_per_pack
    documents["tokens"][bucket_of(doc_len)] = real
    packs = {"count": [0] * NUM_BUCKETS, "tokens": [0] * NUM_BUCKETS}
    packs["count"][bucket_of(docs_per_pack * doc_len)] = steps  # a pack's length is its real tokens
    packs["tokens"][bucket_of(docs_per_pack * doc_len)] = real
    step_s = gpu_time_s / steps
    record: dict[str, Any] = {
        "interval": k,
        "rank": 0,
        "first_step": k * steps + 1,
        "last_step": (k + 1) * steps,
        "steps": steps,
        "gpus": 1,
        "wall_start": 1000.0 + k,
        "wall_end": 1000.0 + k + gpu_time_s,
        "gpu_time_s": gpu_time_s,
        "host_time_s": gpu_time_s,
        "step_time_p50_s": step_s,
        "step_time_p90_s": step_s,
        "step_time_max_s": step_s,
        "timing_lag_steps": 0,
        "tokens": steps * pack,
        "real_tokens": real,
        "packs": steps,
        "documents": steps * docs_per_pack,
        "seqlen_sq_sum_bshd": steps * pack**2,
        "seqlen_sq_sum_thd": steps * docs_per_pack * doc_len**2,
        "flops_bshd": 1.0,  # the agent's own numbers; the server derives every rate from the sums
        "flops_thd": 1.0,
        "flops_useful": 1.0,
        "syncs": {"total": syncs_per_step * steps, "sites": [{"site": "train.py:88", "count": syncs_per_step * steps}]}
        if syncs_counted
        else {"total": 0, "uncounted_steps": steps, "sites": []},  # an interval the agent's sampling skipped
        "histograms": {"documents": documents, "packs": packs},
        "loss": loss,
    }
    if gpu is not None:
        record["gpu"] = gpu
    return record
