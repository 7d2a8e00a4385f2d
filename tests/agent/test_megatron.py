"""Megatron-style loops: ``observe_batch(packed_seq_params=...)`` by duck typing, and the recipe of
docs/agent.md ("Integrations: Megatron-LM") with pipeline and virtual-pipeline stages, against
brute force. Only the first virtual stage of the first pipeline stage observes a micro-batch,
so each model replica counts it once; the agent's data-parallel group sums the replicas."""

from __future__ import annotations

import functools
import json
import operator
import random
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from packscope.agent import Agent, AgentConfig, ModelSpec

MODEL = ModelSpec(layers=4, hidden=64, heads=4, ffn=128, vocab=256)
SEQ_LEN = 128  # the pack length: micro-batches are [1, SEQ_LEN], as in Megatron's packed SFT
PAD_TO = 4  # each document padded to a multiple of this in cu_seqlens_q_padded (as for CP)
PP, VPP, MICRO_BATCHES, STEPS, LOG_EVERY = 2, 2, 4, 4, 2
KEYS = ("tokens", "real_tokens", "packs", "documents", "seqlen_sq_sum_bshd", "seqlen_sq_sum_thd")


@dataclass
class PackedSeqParams:
    """The fields of megatron.core.packed_seq_params.PackedSeqParams that the agent reads."""

    cu_seqlens_q: torch.Tensor
    cu_seqlens_q_padded: torch.Tensor | None = None
    max_seqlen_q: int | None = None
    qkv_format: str = "thd"


def documents(dp_rank: int, step: int, micro_batch: int) -> list[int]:
    """A pure function of where the micro-batch is trained; padded documents fill at most SEQ_LEN."""
    rng = random.Random(f"{dp_rank}-{step}-{micro_batch}")
    docs, room = [], rng.randint(SEQ_LEN // 2, SEQ_LEN)
    while room >= PAD_TO:
        docs.append(rng.randint(1, room))
        room -= -(-docs[-1] // PAD_TO) * PAD_TO
    return docs


def packed_seq_params(docs: list[int]) -> PackedSeqParams:
    cu, padded = [0], [0]
    for d in docs:
        cu.append(cu[-1] + d)
        padded.append(padded[-1] + -(-d // PAD_TO) * PAD_TO)
    return PackedSeqParams(torch.tensor(cu, dtype=torch.int32), torch.tensor(padded, dtype=torch.int32), max(docs))


def brute(docs_per_micro_batch: list[list[int]]) -> dict:
    docs = [d for mb in docs_per_micro_batch for d in mb]
    n = len(docs_per_micro_batch)
    return {
        "tokens": n * SEQ_LEN,
        "real_tokens": sum(docs),
        "packs": n,
        "documents": len(docs),
        "seqlen_sq_sum_bshd": n * SEQ_LEN**2,
        "seqlen_sq_sum_thd": sum(d * d for d in docs),
    }


# -- the recipe, as a simulated Megatron loop ---------------------------------------------------
def is_pipeline_first_stage(pp_rank: int, vp_stage: int) -> bool:
    """megatron.core.parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=...)."""
    return pp_rank == 0 and vp_stage == 0


def interleaved_forward_order(micro_batches: int, vpp: int, pp: int):
    """(virtual stage, micro-batch) in the order the interleaved schedule runs forwards on a rank."""
    for first in range(0, micro_batches, pp):
        for vp_stage in range(vpp):
            for mb in range(first, min(first + pp, micro_batches)):
                yield vp_stage, mb


def train(agent: Agent, pp_rank: int, dp_rank: int, observe_every_chunk: bool = False) -> None:
    for step in range(STEPS):
        agent.step_begin()
        for vp_stage, mb in interleaved_forward_order(MICRO_BATCHES, VPP, PP):
            # forward_step(data_iterator, model_chunk): the recipe's one guarded line.
            if observe_every_chunk or is_pipeline_first_stage(pp_rank, vp_stage):
                agent.observe_batch(
                    packed_seq_params=packed_seq_params(documents(dp_rank, step, mb)), shape=(1, SEQ_LEN)
                )
        agent.step_end(loss=torch.tensor(1.0))


def interval_truth(dp_ranks: range) -> list[dict]:
    per_step = [[documents(d, s, mb) for d in dp_ranks for mb in range(MICRO_BATCHES)] for s in range(STEPS)]
    return [brute(functools.reduce(operator.iadd, per_step[i : i + LOG_EVERY], [])) for i in range(0, STEPS, LOG_EVERY)]


def counts(records) -> list[dict]:
    return [{k: r[k] for k in KEYS} for r in records]


def new_agent(dp_group=None) -> Agent:
    return Agent(AgentConfig(log_every=LOG_EVERY, count_syncs=False), model=MODEL, dp_group=dp_group)


def test_packed_seq_params_equal_the_cu_seqlens_pair():
    docs = [5, 17, 3, 40]
    p = packed_seq_params(docs)
    via_params, via_pair = new_agent(), new_agent()
    for agent in (via_params, via_pair):
        agent.step_begin()
    via_params.observe_batch(packed_seq_params=p, shape=(1, SEQ_LEN))
    via_pair.observe_batch(cu_seqlens=p.cu_seqlens_q, cu_seqlens_padded=p.cu_seqlens_q_padded, shape=(1, SEQ_LEN))
    for agent in (via_params, via_pair):
        agent.step_end()
        agent.close()
    assert counts(via_params.records) == counts(via_pair.records) == [brute([docs])]


def test_packed_seq_params_without_padded_boundaries():
    agent = new_agent()
    agent.step_begin()
    agent.observe_batch(packed_seq_params=PackedSeqParams(torch.tensor([0, 7, 9], dtype=torch.int32)), shape=(1, 16))
    agent.step_end()
    agent.close()
    (r,) = agent.records
    assert (r["tokens"], r["real_tokens"], r["documents"], r["seqlen_sq_sum_thd"]) == (16, 9, 2, 49 + 4)


def test_packed_seq_params_refuse_what_they_cannot_describe():
    agent = new_agent()
    agent.step_begin()
    p = packed_seq_params([4, 4])
    with pytest.raises(ValueError, match="qkv_format='sbhd'"):
        agent.observe_batch(packed_seq_params=PackedSeqParams(p.cu_seqlens_q, qkv_format="sbhd"), shape=(1, 8))
    with pytest.raises(ValueError, match="needs shape"):
        agent.observe_batch(packed_seq_params=p)
    with pytest.raises(ValueError, match="not both"):
        agent.observe_batch(packed_seq_params=p, cu_seqlens=p.cu_seqlens_q, shape=(1, 8))
    with pytest.raises(ValueError, match="must be a tensor"):
        agent.observe_batch(packed_seq_params=PackedSeqParams([0, 4]), shape=(1, 8))  # type: ignore[arg-type]


def test_two_stages_with_two_virtual_stages_count_each_micro_batch_once():
    # One replica (dp 1): an agent per pipeline rank, as each rank would have its own.
    agents = [new_agent() for _ in range(PP)]
    for pp_rank, agent in enumerate(agents):
        train(agent, pp_rank, dp_rank=0)
        agent.close()
    assert counts(agents[0].records) == interval_truth(range(1))
    assert all(r["tokens"] == 0 for r in agents[1].records)  # the last stage observes nothing
    assert [r["steps"] for r in agents[1].records] == [LOG_EVERY] * (STEPS // LOG_EVERY)  # but keeps time


def test_observing_in_every_model_chunk_over_counts_by_the_virtual_stages():
    # What the guard prevents: forward_step runs once per micro-batch in each model chunk.
    agent = new_agent()
    train(agent, pp_rank=0, dp_rank=0, observe_every_chunk=True)
    agent.close()
    truth = interval_truth(range(1))
    assert [r["seqlen_sq_sum_thd"] for r in agent.records] == [VPP * t["seqlen_sq_sum_thd"] for t in truth]


# -- the same recipe on real process groups: pp 2 x dp 2 over gloo ---------------------------------
DP = 2
SPAWN_TIMEOUT_S = 240.0  # 78 s measured on a loaded two-core machine


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=PP * DP, timeout=timedelta(seconds=30)
    )
    try:
        # Megatron's order puts pipeline ranks slowest: rank = pp_rank * DP + dp_rank.
        pp_rank, dp_rank = divmod(rank, DP)
        dp_groups = [dist.new_group([p * DP + d for d in range(DP)]) for p in range(PP)]
        agent = new_agent(dp_groups[pp_rank])
        train(agent, pp_rank, dp_rank)
        agent.close()
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(counts(agent.records)))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # four spawned processes, each importing torch
@pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs torch.distributed with gloo")
def test_pipeline_and_data_parallel_ranks_sum_to_each_micro_batch_once(tmp_path):
    ctx = mp.start_processes(
        _worker, args=(str(tmp_path / "init"), str(tmp_path)), nprocs=PP * DP, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    try:
        while not ctx.join(timeout=1.0):
            assert time.monotonic() < deadline, "workers did not finish (a hang?)"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
                p.join(5)
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(PP * DP)]
    truth = interval_truth(range(DP))
    # Every rank sends its own record; the server sums them. The DP group holding global rank 0
    # counts, so ranks 0 and 1 together hold every replica's micro-batches once.
    summed = [{key: a[key] + b[key] for key in a} for a, b in zip(results[0], results[1], strict=True)]
    assert summed == truth
    assert results[0] != truth  # each rank's own share, not the totals
    assert all(r["tokens"] == 0 for rank in (2, 3) for r in results[rank])
