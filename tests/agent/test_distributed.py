"""Data and context parallelism: real gloo process groups on CPU.

One set of worker processes is spawned per world size (2 and 4); each rank runs every scenario
in sequence, writes its agent's records to JSON, and the test process checks them against a
brute-force per-document computation. The batches are a pure function of (scenario, data rank,
step, micro-batch), so the test process rebuilds every rank's input without it having to travel
back.

Every rank sends its own record (its own counts, gpus = 1) and the server sums them; the agent
runs no collective after its constructor. Scenarios:

* ``uneven``: every rank sees different documents (cu_seqlens with and without a padded
  twin, zero-length entries, empty packs, position_ids, attention_mask, and a plain shape that
  differs per rank), a different number of micro-batches per step; each rank's record holds
  its own batches, and the SUM over the ranks' records equals brute force over all batches.
  The agent has a server here (an unreachable one), so every rank spools to its own file.
* ``cp`` (world 4 only): dp 2 x cp 2 with the layout ``rank = dp_rank * CP + cp_rank`` (CP
  is the fast dimension), so the DP groups are {0, 2} and {1, 3}. CP ranks of one replica see
  the same global cu_seqlens; only the DP group holding rank 0 counts, the others send zeros.
* ``cp_world`` (world 4 only): the same inputs with ``dp_group=None`` (every rank counts), to
  show the check above is sensitive: every replica is then counted twice.
"""

from __future__ import annotations

import json
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
    rng = random.Random(f"{scenario}/{data_rank}/{step}")
    forms = ["cu_padded", "cu_full", "pos", "mask"]
    specs = []
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
        padded = [*starts, rows * row_len]  # each pack's tail padding belongs to its last entry
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
    out = dict.fromkeys(COUNT_KEYS, 0)
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
# Every collective a rank could start; the agent must call none of them after its constructor.
COLLECTIVES = (
    "all_reduce",
    "all_gather",
    "all_gather_into_tensor",
    "all_gather_object",
    "reduce",
    "reduce_scatter_tensor",
    "broadcast",
    "broadcast_object_list",
    "barrier",
    "all_to_all_single",
)


def _run_scenario(scenario: str, data_rank: int, dp_group, spool_dir: str | None = None) -> dict:
    calls: list[str] = []
    originals = {name: getattr(dist, name) for name in COLLECTIVES}

    def counting(name):
        def call(*args, **kwargs):
            calls.append(name)
            return originals[name](*args, **kwargs)

        return call

    server = {"server": "http://127.0.0.1:9", "spool_dir": spool_dir, "request_timeout_s": 0.2} if spool_dir else {}
    agent = Agent(
        AgentConfig(log_every=LOG_EVERY, count_syncs=False, sample_gpu=False, **server),
        model=MODEL,
        device="cpu",
        dp_group=dp_group,
    )
    for name in COLLECTIVES:  # the agent looks them up on the module at call time
        setattr(dist, name, counting(name))
    try:
        for step in range(1, STEPS + 1):
            agent.step_begin()
            for spec in batch_specs(scenario, data_rank, step):
                observe(agent, spec)
            agent.step_end(loss=float(dist.get_rank() + step), lr=1e-3)
        agent.close(timeout_s=0.5)
    finally:
        for name, original in originals.items():
            setattr(dist, name, original)
    spool = None if agent.sender is None else {"path": str(agent.sender.spool.path), "records": len(agent.sender.spool)}
    return {
        "records": list(agent.records),
        "collectives": calls,
        "run_id": agent.run_id,
        "rank": agent.rank,
        "world_size": agent.world_size,
        "dp_size": agent.dp_size,
        "counts_batches": agent.counts_batches,
        "spool": spool,
    }


def _worker(rank: int, world: int, init_file: str, out_dir: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"file://{init_file}", rank=rank, world_size=world, timeout=COLLECTIVE_TIMEOUT
    )
    try:
        results = {"uneven": _run_scenario("uneven", rank, None, spool_dir=str(Path(out_dir, "spool")))}
        if world == 4:
            dp, cp = world // CP, CP
            # rank = dp_rank * CP + cp_rank. Every rank creates every group, in the same order.
            dp_groups = [dist.new_group([d * cp + c for d in range(dp)]) for c in range(cp)]
            dp_rank, cp_rank = divmod(rank, cp)
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
    ctx = mp.start_processes(
        _worker, args=(world, str(init_file), str(root)), nprocs=world, join=False, start_method="spawn"
    )
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
            except (Exception, pytest.fail.Exception) as exc:  # noqa: BLE001 - remembered: a hang costs its timeout once
                cache[world] = f"world {world}: the workers failed: {exc!r}"[:4000]
        if isinstance(cache[world], str):
            pytest.fail(cache[world])
        return cache[world]

    return get


# -- checks -----------------------------------------------------------------------------------
def summed(per_rank: list[list[dict]]) -> list[dict]:
    """What the server's sums over ranks hold: each interval's counts and histograms added up."""
    out = []
    for recs in zip(*per_rank, strict=True):
        assert len({r["interval"] for r in recs}) == 1
        total = {k: sum(r[k] for r in recs) for k in (*COUNT_KEYS, "flops_thd", "flops_bshd", "flops_useful", "gpus")}
        total["histograms"] = {
            kind: {
                part: [sum(r["histograms"][kind][part][b] for r in recs) for b in range(NUM_BUCKETS)]
                for part in ("count", "tokens")
            }
            for kind in ("documents", "packs")
        }
        out.append(total)
    return out


def assert_counts(records: list[dict], expected: list[dict], where: str) -> None:
    assert len(records) == len(expected) == INTERVALS
    for i, (rec, exp) in enumerate(zip(records, expected, strict=True)):
        assert {k: rec[k] for k in COUNT_KEYS} == {k: exp[k] for k in COUNT_KEYS}, f"{where}, interval {i}"
        assert rec["histograms"] == exp["histograms"], f"{where}, interval {i}"
        # FLOPs are linear in the sums, so the per-rank FLOPs add up to those of the totals.
        assert rec["flops_thd"] == pytest.approx(float(MODEL.flops(exp["tokens"], exp["seqlen_sq_sum_thd"])), rel=1e-12)
        assert rec["flops_bshd"] == pytest.approx(
            float(MODEL.flops(exp["tokens"], exp["seqlen_sq_sum_bshd"])), rel=1e-12
        )
        assert rec["flops_useful"] == pytest.approx(
            float(MODEL.flops(exp["real_tokens"], exp["seqlen_sq_sum_thd"])), rel=1e-12
        )


def assert_own_records(records: list[dict], rank: int) -> None:
    assert [r["interval"] for r in records] == list(range(INTERVALS))
    assert [(r["first_step"], r["last_step"], r["steps"]) for r in records] == [
        (i * LOG_EVERY + 1, (i + 1) * LOG_EVERY, LOG_EVERY) for i in range(INTERVALS)
    ]
    assert all(r["rank"] == rank and r["gpus"] == 1 for r in records)
    assert all(r["gpu_time_s"] > 0 for r in records)  # its own step times


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
def test_each_rank_sends_its_own_counts_and_their_sum_is_the_total(runs, world):
    results = runs(world)
    assert len({res["uneven"]["run_id"] for res in results}) == 1  # rank 0's run id, broadcast
    for rank, res in enumerate(results):
        r = res["uneven"]
        assert r["rank"] == rank and r["world_size"] == world and r["counts_batches"]
        assert_own_records(r["records"], rank)
        assert_counts(r["records"], expected_intervals("uneven", [rank]), f"rank {rank}")
    total = summed([res["uneven"]["records"] for res in results])
    assert_counts(total, expected_intervals("uneven", list(range(world))), "sum over ranks")
    assert all(t["gpus"] == world for t in total)  # Σ gpus: the GPU-seconds cover every rank


@pytest.mark.parametrize("world", [2, 4])
def test_the_agent_runs_no_collective_after_its_constructor(runs, world):
    for res in runs(world):
        for scenario in res.values():
            assert scenario["collectives"] == []


@pytest.mark.parametrize("world", [2, 4])
def test_every_rank_has_a_sender_with_its_own_spool(runs, world):
    spools = [res["uneven"]["spool"] for res in runs(world)]
    assert all(s is not None for s in spools)
    assert len({s["path"] for s in spools}) == world  # ranks of one host never share a spool file
    assert "rank" not in Path(spools[0]["path"]).parent.name  # rank 0 keeps the single-process path
    assert all(s["records"] == INTERVALS for s in spools)  # the server is down: every record waits


def test_context_parallel_peers_send_timing_with_zero_counts(runs):
    world, dp = 4, 4 // CP
    results = runs(world)
    zeros = expected_intervals("cp", [])
    for rank, res in enumerate(results):
        r = res["cp"]
        dp_rank, cp_rank = divmod(rank, CP)
        assert r["dp_size"] == dp and r["world_size"] == world
        assert r["counts_batches"] == (cp_rank == 0)  # the DP group {0, 2} holds rank 0
        assert_own_records(r["records"], rank)
        assert_counts(r["records"], expected_intervals("cp", [dp_rank]) if cp_rank == 0 else zeros, f"rank {rank}")
    total = summed([res["cp"]["records"] for res in results])
    assert_counts(total, expected_intervals("cp", list(range(dp))), "sum over ranks")  # each replica once


def test_context_parallel_without_dp_group_counts_each_replica_cp_times(runs):
    """The control for the test above: with every rank counting, CP peers count twice."""
    world, dp = 4, 4 // CP
    results = runs(world)
    doubled = expected_intervals("cp", list(range(dp)), weight=CP)
    once = expected_intervals("cp", list(range(dp)))
    assert doubled[0]["tokens"] == CP * once[0]["tokens"]
    total = summed([res["cp_world"]["records"] for res in results])
    assert_counts(total, doubled, "sum over ranks")
