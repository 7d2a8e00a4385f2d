"""Data and context parallelism: real gloo process groups on CPU.

One set of worker processes is spawned per world size (2 and 4); each rank runs every scenario
in sequence, writes its agent's records to JSON, and the test process checks them against a
brute-force per-document computation over all ranks. The batches are a pure function of
(scenario, data rank, step, micro-batch), so the test process rebuilds every rank's input
without it having to travel back.

Scenarios:

* ``uneven``: every rank sees different documents (cu_seqlens with and without a padded
  twin, zero-length entries, empty packs, position_ids, attention_mask, and an extra plain
  shape that differs per rank), a different number of micro-batches per step; the totals must
  be the sum over all ranks, on every rank, with one all_reduce per logging interval.
* ``fixed``: only identical plain shapes, promised with ``uniform_shapes=True``: no collective
  at all, totals scaled by dp size.
* ``ragged``: plain shapes that differ by rank, default config: summed with one all_reduce.
* ``cp`` (world 4 only): dp 2 x cp 2 with the layout ``rank = dp_rank * CP + cp_rank`` (CP
  is the fast dimension), so the DP groups are {0, 2} and {1, 3} and the CP groups {0, 1} and
  {2, 3}. CP ranks of one replica see the same global cu_seqlens; with the DP group handed to
  the agent, each replica is counted once.
* ``cp_world`` (world 4 only): the same inputs with ``dp_group=None`` (the whole world), to
  show the check above is sensitive: every replica is then counted twice.
"""

from __future__ import annotations

import json
import os
import random
import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from packscope.agent import Agent, AgentConfig, ModelSpec
from packscope.agent.histograms import NUM_BUCKETS

MODEL = ModelSpec(layers=2, hidden=64, heads=4, ffn=128, vocab=256)
LOG_EVERY = 2
STEPS = 6
INTERVALS = STEPS // LOG_EVERY
CP = 2  # context-parallel size of the "cp" scenarios (world 4 = dp 2 x cp 2)
SPAWN_TIMEOUT_S = 90.0
COLLECTIVE_TIMEOUT = timedelta(seconds=30)
COUNT_KEYS = ("tokens", "real_tokens", "packs", "documents", "seqlen_sq_sum_bshd", "seqlen_sq_sum_thd")

pytestmark = pytest.mark.skipif(
    not (dist.is_available() and dist.is_gloo_available()), reason="torch.distributed with gloo is needed"
)


# -- inputs: a pure function of (scenario, data rank, step) -----------------------------------
# A micro-batch spec is a dict: {"form": ..., "rows": R, "row_len": L, "packs": [[doc lengths] per row]}
# ("packs" is absent for the plain "shape" form, whose rows are each one full document).


def _packs(rng: random.Random, rows: int, row_len: int, zeros: bool) -> list[list[int]]:
    packs = []
    for _ in range(rows):
        docs, room = [], row_len
        if rng.random() < 0.15:  # an empty pack
            packs.append([0] if zeros else [])
            continue
        for _ in range(rng.randint(1, 6)):
            if room == 0:
                break
            if zeros and rng.random() < 0.25:
                docs.append(0)  # a zero-length entry (repeated boundary)
            d = rng.randint(1, room)
            if rng.random() < 0.5:
                d = rng.randint(1, max(1, room // 3))
            docs.append(d)
            room -= d
        if zeros and rng.random() < 0.2:
            docs.append(0)
        packs.append(docs)
    return packs


def batch_specs(scenario: str, data_rank: int, step: int) -> list[dict]:
    """The micro-batches one data rank observes on one step (1-based)."""
    if scenario == "fixed":  # identical on every rank, different from step to step
        return [{"form": "shape", "rows": 1 + step % 3, "row_len": 32 << (step % 4)}]
    if scenario == "ragged":  # plain shapes that differ by rank (dynamic padding per rank)
        return [{"form": "shape", "rows": 2, "row_len": 64 * (1 + data_rank)}]
    rng = random.Random(f"{scenario}/{data_rank}/{step}")
    forms = ["cu_padded", "cu_full", "pos", "mask"]
    specs = []
    # Every step starts with a form that reads the device, on every rank, so that every interval
    # takes the all_reduce path everywhere (the agent requires the same path on all ranks).
    for micro in range(1 + (data_rank + step) % 3):  # uneven micro-batch counts across ranks
        form = forms[(step + micro + data_rank) % len(forms)]
        rows, row_len = rng.randint(1, 4), rng.choice([16, 64, 100, 512, 1024])
        if form == "cu_full":  # documents fill each pack exactly, no padded twin needed
            packs = []
            for _ in range(rows):
                docs, room = [], row_len
                while room:
                    d = min(room, rng.randint(1, row_len))
                    docs.append(d)
                    room -= d
                    if rng.random() < 0.3:
                        docs.append(0)
                packs.append(docs)
        elif form == "mask":  # BSHD padded rows: one document per row, possibly all padding
            packs = [[rng.choice([0, rng.randint(1, row_len), row_len])] for _ in range(rows)]
        else:
            packs = _packs(rng, rows, row_len, zeros=form == "cu_padded")
        specs.append({"form": form, "rows": rows, "row_len": row_len, "packs": packs})
    if scenario == "uneven" and step % 2:  # plus a plain shape that differs per rank
        specs.append({"form": "shape", "rows": 1 + data_rank, "row_len": 8 << data_rank})
    return specs


def observe(agent: Agent, spec: dict) -> None:
    rows, row_len = spec["rows"], spec["row_len"]
    form = spec["form"]
    if form == "shape":
        agent.observe_batch(shape=(rows, row_len))
    elif form == "cu_full":
        cu = [0]
        for docs in spec["packs"]:
            for d in docs:
                cu.append(cu[-1] + d)
        assert cu[-1] == rows * row_len
        agent.observe_batch(cu_seqlens=torch.tensor(cu, dtype=torch.int32), shape=(rows, row_len))
    elif form == "cu_padded":  # Transformer Engine's pair: real lengths + physical placement
        cu, starts = [0], []
        for p, docs in enumerate(spec["packs"]):
            offset = p * row_len
            for d in docs:
                cu.append(cu[-1] + d)
                starts.append(offset)
                offset += d
        padded = starts + [rows * row_len]  # each pack's tail padding belongs to its last entry
        assert padded[0] == 0  # with zero-length entries on, an empty pack still has one entry
        cu_t, padded_t = torch.tensor(cu, dtype=torch.int32), torch.tensor(padded, dtype=torch.int32)
        assert cu_t.shape == padded_t.shape
        agent.observe_batch(cu_seqlens=cu_t, cu_seqlens_padded=padded_t, shape=(rows, row_len))
    elif form == "pos":  # HF position_ids restarting per document, padding masked out
        pos = torch.zeros(rows, row_len, dtype=torch.int64)
        mask = torch.zeros(rows, row_len, dtype=torch.bool)
        for r, docs in enumerate(spec["packs"]):
            at = 0
            for d in docs:
                pos[r, at : at + d] = torch.arange(d)
                mask[r, at : at + d] = True
                at += d
        agent.observe_batch(position_ids=pos, attention_mask=mask)
    elif form == "mask":
        mask = torch.zeros(rows, row_len, dtype=torch.int64)
        for r, (d,) in enumerate(spec["packs"]):
            mask[r, :d] = 1
        agent.observe_batch(attention_mask=mask)
    else:  # pragma: no cover
        raise AssertionError(form)


# -- the brute-force reference ----------------------------------------------------------------
def _bucket(length: int) -> int:
    return min(length.bit_length() - 1, NUM_BUCKETS - 1)


def brute(specs: list[dict]) -> dict:
    """Totals of a list of micro-batches, one document at a time."""
    out = {k: 0 for k in COUNT_KEYS}
    hist = {k: {"count": [0] * NUM_BUCKETS, "tokens": [0] * NUM_BUCKETS} for k in ("documents", "packs")}

    def doc(length: int) -> None:
        out["documents"] += 1
        out["real_tokens"] += length
        out["seqlen_sq_sum_thd"] += length * length
        hist["documents"]["count"][_bucket(length)] += 1
        hist["documents"]["tokens"][_bucket(length)] += length

    def pack(real: int) -> None:
        if real > 0:
            hist["packs"]["count"][_bucket(real)] += 1
            hist["packs"]["tokens"][_bucket(real)] += real

    for s in specs:
        rows, row_len = s["rows"], s["row_len"]
        out["tokens"] += rows * row_len
        out["packs"] += rows
        out["seqlen_sq_sum_bshd"] += rows * row_len * row_len
        packs = s.get("packs") or [[row_len]] * rows  # plain shape: one full document per row
        for docs in packs:
            for d in docs:
                if d > 0:
                    doc(d)
            pack(sum(docs))
    out["histograms"] = hist
    return out


def expected_intervals(scenario: str, data_ranks: list[int], weight: int = 1) -> list[dict]:
    """Per-interval totals over the given data ranks (each counted ``weight`` times)."""
    result = []
    for i in range(INTERVALS):
        steps = range(i * LOG_EVERY + 1, (i + 1) * LOG_EVERY + 1)
        specs = [s for r in data_ranks for st in steps for s in batch_specs(scenario, r, st)] * weight
        result.append(brute(specs))
    return result


# -- the worker -------------------------------------------------------------------------------
def _group_ranks(group) -> list[int] | str:
    return "world" if group is None else sorted(dist.get_process_group_ranks(group))


def _run_scenario(scenario: str, data_rank: int, dp_group) -> dict:
    calls: list[dict] = []
    holder: dict = {}
    original = dist.all_reduce

    def counting_all_reduce(tensor, op=dist.ReduceOp.SUM, group=None, async_op=False):
        calls.append({"step": holder["agent"].step, "group": _group_ranks(group), "numel": tensor.numel()})
        return original(tensor, op=op, group=group, async_op=async_op)

    dist.all_reduce = counting_all_reduce  # the agent looks it up on the module at call time
    try:
        # Only the "fixed" scenario promises identical plain shapes on every rank.
        agent = Agent(AgentConfig(log_every=LOG_EVERY, count_syncs=False, sample_gpu=False,
                                  uniform_shapes=scenario == "fixed"),
                      model=MODEL, device="cpu", dp_group=dp_group)
        holder["agent"] = agent
        for step in range(1, STEPS + 1):
            agent.step_begin()
            for spec in batch_specs(scenario, data_rank, step):
                observe(agent, spec)
            agent.step_end(loss=float(dist.get_rank() + step), lr=1e-3)
        agent.close()
    finally:
        dist.all_reduce = original
    return {
        "records": list(agent.records), "all_reduce_calls": calls, "run_id": agent.run_id,
        "rank": agent.rank, "world_size": agent.world_size, "dp_size": agent.dp_size,
        "sender_is_none": agent.sender is None,
    }


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world,
                            timeout=COLLECTIVE_TIMEOUT)
    try:
        results = {
            "uneven": _run_scenario("uneven", rank, None),
            "fixed": _run_scenario("fixed", rank, None),
            "ragged": _run_scenario("ragged", rank, None),
        }
        if world == 4:
            dp, cp = world // CP, CP
            # rank = dp_rank * CP + cp_rank. Every rank creates every group, in the same order.
            dp_groups = [dist.new_group([d * cp + c for d in range(dp)]) for c in range(cp)]
            cp_groups = [dist.new_group([d * cp + c for c in range(cp)]) for d in range(dp)]
            dp_rank, cp_rank = divmod(rank, cp)
            assert dist.get_process_group_ranks(cp_groups[dp_rank]) == [dp_rank * cp + c for c in range(cp)]
            # CP ranks of one replica observe the same global cu_seqlens: the data key is dp_rank.
            results["cp"] = _run_scenario("cp", dp_rank, dp_groups[cp_rank])
            results["cp_world"] = _run_scenario("cp", dp_rank, None)
        dist.barrier()
        Path(out_dir, f"rank{rank}.json").write_text(json.dumps(results))
    finally:
        dist.destroy_process_group()


def _spawn(world: int, root: Path) -> list[dict]:
    root.mkdir(parents=True, exist_ok=True)
    init_file = root / "init"
    ctx = mp.start_processes(_worker, args=(world, str(init_file), str(root)), nprocs=world,
                             join=False, start_method="spawn")
    deadline = time.monotonic() + SPAWN_TIMEOUT_S
    try:
        while not ctx.join(timeout=1.0):
            if time.monotonic() > deadline:
                pytest.fail(f"world {world}: workers did not finish within {SPAWN_TIMEOUT_S:.0f} s (a hang?)")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
                p.join(5)
    return [json.loads((root / f"rank{r}.json").read_text()) for r in range(world)]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """runs(world) -> per-rank results; one spawn per world size for the whole module."""
    cache: dict[int, list[dict] | str] = {}

    def get(world: int) -> list[dict]:
        if world not in cache:
            try:
                cache[world] = _spawn(world, tmp_path_factory.mktemp(f"world{world}"))
            except (Exception, pytest.fail.Exception) as exc:  # remembered, so that a hang costs its timeout once
                cache[world] = f"world {world}: the workers failed: {exc!r}"[:4000]
        if isinstance(cache[world], str):
            pytest.fail(cache[world])
        return cache[world]

    return get


# -- checks -----------------------------------------------------------------------------------
def assert_totals(records: list[dict], expected: list[dict], world: int, rank: int) -> None:
    assert [r["interval"] for r in records] == list(range(INTERVALS))
    assert [(r["first_step"], r["last_step"], r["steps"]) for r in records] == [
        (i * LOG_EVERY + 1, (i + 1) * LOG_EVERY, LOG_EVERY) for i in range(INTERVALS)
    ]
    for rec, exp in zip(records, expected):
        got = {k: rec[k] for k in COUNT_KEYS}
        assert got == {k: exp[k] for k in COUNT_KEYS}, f"rank {rank}, interval {rec['interval']}"
        assert rec["histograms"] == exp["histograms"], f"rank {rank}, interval {rec['interval']}"
        assert rec["gpus"] == world and rec["rank"] == rank
        assert rec["flops_thd"] == float(MODEL.flops(exp["tokens"], exp["seqlen_sq_sum_thd"]))
        assert rec["flops_bshd"] == float(MODEL.flops(exp["tokens"], exp["seqlen_sq_sum_bshd"]))
        assert rec["flops_useful"] == float(MODEL.flops(exp["real_tokens"], exp["seqlen_sq_sum_thd"]))


def test_reference_inputs_are_uneven_and_cover_every_form():
    """Guards the generator: the ranks really differ, and the edge cases really occur."""
    for world in (2, 4):
        per_rank = [expected_intervals("uneven", [r]) for r in range(world)]
        for i in range(INTERVALS):
            assert len({json.dumps(p[i], sort_keys=True) for p in per_rank}) == world
    specs = [s for r in range(4) for st in range(1, STEPS + 1) for s in batch_specs("uneven", r, st)]
    assert {s["form"] for s in specs} == {"cu_padded", "cu_full", "pos", "mask", "shape"}
    assert any(0 in s["packs"][i] for s in specs if s["form"].startswith("cu") for i in range(s["rows"]))
    assert any(sum(p) == 0 for s in specs if "packs" in s for p in s["packs"])  # an empty pack / row
    counts = {len(batch_specs("uneven", r, 1)) for r in range(4)}
    assert len(counts) > 1  # uneven micro-batch counts


@pytest.mark.parametrize("world", [2, 4])
def test_uneven_documents_are_summed_over_ranks_on_every_rank(runs, world):
    results = runs(world)
    expected = expected_intervals("uneven", list(range(world)))
    run_ids = {res["uneven"]["run_id"] for res in results}
    assert len(run_ids) == 1  # rank 0's run id, broadcast
    for rank, res in enumerate(results):
        r = res["uneven"]
        assert r["rank"] == rank and r["world_size"] == world and r["dp_size"] == world
        assert r["sender_is_none"]  # no server configured; only rank 0 would ever get one
        assert_totals(r["records"], expected, world, rank)


@pytest.mark.parametrize("world", [2, 4])
def test_one_all_reduce_per_logging_interval(runs, world):
    for rank, res in enumerate(runs(world)):
        calls = res["uneven"]["all_reduce_calls"]
        assert len(calls) == INTERVALS, calls  # not one per step (STEPS), nor per micro-batch
        assert [c["step"] for c in calls] == [LOG_EVERY * (i + 1) for i in range(INTERVALS)]
        assert all(c["group"] == "world" for c in calls)


@pytest.mark.parametrize("world", [2, 4])
def test_fixed_shapes_scale_locally_without_a_collective(runs, world):
    per_rank = expected_intervals("fixed", [0])
    scaled = expected_intervals("fixed", [0], weight=world)
    assert scaled[0]["tokens"] == world * per_rank[0]["tokens"]
    for rank, res in enumerate(runs(world)):
        r = res["fixed"]
        assert r["all_reduce_calls"] == []
        assert_totals(r["records"], scaled, world, rank)


@pytest.mark.parametrize("world", [2, 4])
def test_plain_shapes_that_differ_by_rank_are_summed_by_default(runs, world):
    expected = expected_intervals("ragged", list(range(world)))
    for rank, res in enumerate(runs(world)):
        r = res["ragged"]
        assert len(r["all_reduce_calls"]) == INTERVALS
        assert_totals(r["records"], expected, world, rank)


def test_context_parallel_ranks_are_not_double_counted(runs):
    world, dp = 4, 4 // CP
    results = runs(world)
    expected = expected_intervals("cp", list(range(dp)))  # the DP replicas only, once each
    for rank, res in enumerate(results):
        r = res["cp"]
        assert r["dp_size"] == dp and r["world_size"] == world
        assert_totals(r["records"], expected, world, rank)
        cp_rank = rank % CP
        my_dp_group = [d * CP + cp_rank for d in range(dp)]  # {0, 2} or {1, 3}
        assert [c["group"] for c in r["all_reduce_calls"]] == [my_dp_group] * INTERVALS
        assert [c["step"] for c in r["all_reduce_calls"]] == [LOG_EVERY * (i + 1) for i in range(INTERVALS)]


def test_context_parallel_without_dp_group_counts_each_replica_cp_times(runs):
    """The control for the test above: over the whole world, CP ranks are counted twice."""
    world, dp = 4, 4 // CP
    results = runs(world)
    doubled = expected_intervals("cp", list(range(dp)), weight=CP)
    once = expected_intervals("cp", list(range(dp)))
    assert doubled[0]["tokens"] == CP * once[0]["tokens"]
    for rank, res in enumerate(results):
        r = res["cp_world"]
        assert r["dp_size"] == world
        assert_totals(r["records"], doubled, world, rank)
        assert len(r["all_reduce_calls"]) == INTERVALS
