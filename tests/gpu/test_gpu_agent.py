"""The agent on a real GPU: exact, lazily timed, and adding no host synchronization.

Run on the H200 machine: ``python -m pytest -m gpu tests/gpu``. Results are summarised in
docs/BENCHMARKS.md, each run in the log docs/benchmarks/ with date and device.
"""

import time

import pytest
import torch

from packscope.agent import Agent, AgentConfig, ModelSpec
from packscope.agent.sync_sites import shown_path
from packscope.agent.syncs import SyncCounter

pytestmark = pytest.mark.gpu  # deselected by default (pyproject addopts); run with -m gpu

MODEL = ModelSpec(layers=2, hidden=64, heads=4, ffn=128, vocab=256)


def cupti_counter():
    from packscope.agent.cupti import CuptiSyncCounter

    try:
        return CuptiSyncCounter().install()
    except RuntimeError as exc:
        pytest.fail(f"CUPTI backend unavailable on the GPU machine: {exc}")


def workload(x, w, n=8):
    for _ in range(n):
        x = torch.tanh(x @ w)
    return x


def thd_batch(device, packs=4, pack_len=2048):
    g = torch.Generator().manual_seed(0)
    cu = [0]
    for p in range(packs):
        end = (p + 1) * pack_len
        while cu[-1] < end:
            cu.append(min(end, cu[-1] + int(torch.randint(16, 700, (1,), generator=g))))
    return torch.tensor(cu, dtype=torch.int32).to(device), (packs, pack_len)


def test_event_timing_matches_synchronized_host_clock_over_200_steps():
    dev = torch.device("cuda")
    x, w = torch.randn(4096, 4096, device=dev), torch.randn(4096, 4096, device=dev) / 64
    agent = Agent(AgentConfig(log_every=50, count_syncs=False), model=MODEL)
    workload(x, w)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(200):
        agent.step_begin()
        workload(x, w)
        agent.step_end()
    torch.cuda.synchronize()
    host = time.perf_counter() - t0
    agent.close()
    recs = list(agent.records)
    assert [r["steps"] for r in recs] == [50, 50, 50, 50]
    assert [r["first_step"] for r in recs] == [1, 51, 101, 151]
    events = sum(r["gpu_time_s"] for r in recs)
    assert abs(events - host) / host < 0.01, (events, host)


def test_records_arrive_lagged_but_exactly_once_in_order():
    dev = torch.device("cuda")
    x, w = torch.randn(2048, 2048, device=dev), torch.randn(2048, 2048, device=dev) / 45
    agent = Agent(AgentConfig(log_every=3, count_syncs=False), model=MODEL)
    seen_before_close = 0
    for _ in range(30):
        agent.step_begin()
        workload(x, w, 4)
        agent.step_end(loss=x.sum())
        # A host that waits on its data loader, as real ones do; without it the host would
        # queue all 30 steps before the GPU had finished the first few.
        time.sleep(0.005)
        seen_before_close = len(agent.records)
    agent.close()
    recs = list(agent.records)
    assert seen_before_close >= 5  # reported while running, not only at close
    assert [r["interval"] for r in recs] == list(range(10))
    assert all(r["steps"] == 3 for r in recs)
    assert max(r["timing_lag_steps"] for r in recs) >= 0


def test_agent_adds_no_sync_on_non_logging_steps_cupti():
    dev = torch.device("cuda")
    cu, shape = thd_batch(dev)
    mask = torch.ones(shape[0] * shape[1], dtype=torch.bool, device=dev)
    x, w = torch.randn(2048, 2048, device=dev), torch.randn(2048, 2048, device=dev) / 45
    agent = Agent(AgentConfig(log_every=10, count_syncs=False), model=MODEL)
    for _ in range(12):  # warm-up: pinned buffers and events are allocated once
        agent.step_begin()
        agent.observe_batch(cu_seqlens=cu, shape=shape, token_mask=mask)
        workload(x, w, 2)
        agent.step_end(loss=x.mean())
    counter = cupti_counter()
    try:
        per_step = []
        for _ in range(40):
            before = counter.total
            agent.step_begin()
            agent.observe_batch(cu_seqlens=cu, shape=shape, token_mask=mask)
            workload(x, w, 2)
            agent.step_end(loss=x.mean())
            per_step.append(counter.total - before)
    finally:
        counter.uninstall()
    agent.close()
    assert sum(per_step) == 0, (per_step, dict(counter.sites))


def inject_syncs(x, pageable):
    """One micro-batch that carries six known host syncs, one per line."""
    x.sum().item()  # .item()
    x[:4, 0].tolist()  # .tolist()
    torch.nonzero(x[:64, 0] > 0)  # nonzero: output size depends on the data
    torch.cuda.synchronize()  # explicit
    torch.tensor([1.0], device="cuda")  # a pageable blocking host-to-device copy
    pageable.copy_(x[:4, 0], non_blocking=True)  # "non-blocking" into pageable memory: blocks


INJECTED_LINES = 6
HERE = shown_path(__file__)  # this file as a sync site names it (agent/sync_sites.py)


@pytest.mark.parametrize("backend", ["debug-mode", "cupti"])
def test_both_backends_count_injected_syncs(backend):
    dev = torch.device("cuda")
    x = torch.randn(1024, 64, device=dev)
    pageable = torch.empty(4)
    counter = cupti_counter() if backend == "cupti" else SyncCounter().install()
    try:
        base = counter.total
        for _ in range(3):  # three micro-batches
            inject_syncs(x, pageable)
        total, sites = counter.snapshot()
    finally:
        counter.uninstall()
    n = total - base
    print(f"{backend}: {n} syncs; sites {dict(sites)}")
    first = inject_syncs.__code__.co_firstlineno + 2  # the .item() line
    lines = {f"{HERE}:{first + k} in inject_syncs": 3 for k in range(INJECTED_LINES)}
    pageable_copy = f"{HERE}:{first + INJECTED_LINES - 1} in inject_syncs"
    if backend == "cupti":
        assert dict(sites) == lines  # every injected sync, once each, at its own line
    else:
        # PyTorch's debug mode does not flag a non_blocking copy into pageable memory
        # (docs/benchmarks/2026-11-29-h200.md#h200-2026-11-29-tests): the one difference between the backends here.
        lines.pop(pageable_copy)
        assert {s: c for s, c in sites.items() if s != pageable_copy} == lines


def test_debug_mode_counter_sees_nothing_from_the_agent():
    dev = torch.device("cuda")
    cu, shape = thd_batch(dev)
    agent = Agent(AgentConfig(log_every=5, count_syncs=True, count_syncs_every=1), model=MODEL)
    x = torch.randn(512, 512, device=dev)
    for _ in range(23):
        agent.step_begin()
        agent.observe_batch(cu_seqlens=cu, shape=shape)
        agent.observe_batch(position_ids=torch.arange(512, device=dev).remainder(100).unsqueeze(0))
        agent.observe_batch(attention_mask=torch.ones(2, 256, device=dev, dtype=torch.long))
        agent.step_end(loss=x.sum(), grad_norm=x.norm())
    agent.close()
    assert sum(r["syncs"]["total"] for r in agent.records) == 0
    assert all(r["documents"] > 0 for r in agent.records)


def test_vision_sums_on_cuda_add_no_sync_and_equal_the_reference():
    """A Qwen2.5-VL micro-batch's image grid on the device, counted at the boundary with no host
    sync (run on the H200 on 2026-12-01: 5 records, 0 syncs, every record equal to the reference)."""
    from packscope.core.hf_config import read_hf_config
    from packscope.core.vision import batch_sums
    from tests.core.published_vision import PUBLISHED_VISION

    dev = torch.device("cuda")
    qwen = read_hf_config(PUBLISHED_VISION["qwen2_5_vl_7b.json"])
    grids = [(1, 36, 52), (2, 20, 28)]
    table = torch.tensor(grids, device=dev)
    cu = torch.tensor([0, 300, 1024, 1500, 2048], dtype=torch.int32, device=dev)
    agent = Agent(AgentConfig(log_every=5, count_syncs=True, count_syncs_every=1), model=qwen, device=dev)
    x = torch.randn(512, 512, device=dev)
    for _ in range(23):
        agent.step_begin()
        agent.observe_batch(cu_seqlens=cu, shape=(1, 2048), image_grid_thw=table)
        agent.step_end(loss=x.sum(), grad_norm=x.norm())
    agent.close()
    reference = batch_sums(qwen.vision, grids)
    assert len(agent.records) == 5
    assert sum(r["syncs"]["total"] for r in agent.records) == 0
    assert all(r[name] == n * r["steps"] for r in agent.records for name, n in reference.items())


def test_padded_rows_vision_sums_on_cuda_add_no_sync_and_equal_the_reference():
    """Gemma 4's image_position_ids on the device, micro-batches of two slot widths in one interval
    (their tables are not concatenated), counted at the boundary with no host sync."""
    from packscope.core.flops import ModelSpec
    from packscope.core.vision import VisionSpec, padded_rows_sums
    from tests.agent.test_vision import position_table

    dev = torch.device("cuda")
    vision = VisionSpec(
        tower="gemma4", layers=16, hidden=768, heads=12, ffn=3072, gated=True, patch_size=16, patch_inputs=768,
        spatial_merge=3, projector=((768, 2304),),
    )  # fmt: skip
    model = ModelSpec(layers=2, hidden=256, heads=4, ffn=512, vocab=1024, vision=vision)
    batches = [([(42, 57), (48, 48)], 2520), ([(12, 15)], 630)]
    tables = [position_table(grids, slots).to(dev) for grids, slots in batches]
    cu = torch.tensor([0, 300, 1024, 1500, 2048], dtype=torch.int32, device=dev)
    agent = Agent(AgentConfig(log_every=4, count_syncs=True, count_syncs_every=1), model=model, device=dev)
    x = torch.randn(512, 512, device=dev)
    for _ in range(8):
        agent.step_begin()
        for table in tables:
            agent.observe_batch(cu_seqlens=cu, shape=(1, 2048), image_position_ids=table)
        agent.step_end(loss=x.sum(), grad_norm=x.norm())
    agent.close()
    per_batch = [padded_rows_sums(vision, grids, slots) for grids, slots in batches]
    one_step = {name: sum(sums[name] for sums in per_batch) for name in per_batch[0]}
    assert len(agent.records) == 2
    assert sum(r["syncs"]["total"] for r in agent.records) == 0
    assert all(r[name] == n * r["steps"] for r in agent.records for name, n in one_step.items())


def test_gpu_sums_equal_cpu_sums():
    """The device reduction must give the same integers as the CPU path."""
    cu, shape = thd_batch("cpu", packs=8, pack_len=4096)
    results = []
    for dev in ("cpu", "cuda"):
        agent = Agent(AgentConfig(log_every=4, count_syncs=False), model=MODEL, device=dev)
        for _ in range(4):
            agent.step_begin()
            agent.observe_batch(cu_seqlens=cu.to(dev), shape=shape)
            agent.step_end()
        agent.close()
        (r,) = agent.records
        results.append({k: r[k] for k in ("tokens", "real_tokens", "documents", "seqlen_sq_sum_thd", "histograms")})
    assert results[0] == results[1]


def test_reference_trainer_syncs_per_step_agent_on_equals_off():
    """CUPTI counts every blocking driver call of real trainer steps, with and without the agent."""
    from packscope.trainer.config import TrainConfig
    from packscope.trainer.train import Trainer, train_step

    cfg = TrainConfig(
        preset="tiny",
        layout="thd",
        pack_length=2048,
        packs_per_step=2,
        device="cuda",
        progress=False,
        steps=1000,
        log_every=10,
    )
    trainer = Trainer(cfg)
    pool = [trainer.next_batches() for _ in range(8)]
    agent = Agent(
        AgentConfig(log_every=10, count_syncs=False, sample_gpu=False), model=trainer.model_cfg.to_model_spec()
    )

    def step(i, with_agent):
        train_step(trainer, pool[i % len(pool)], agent if with_agent else None)

    for i in range(25):  # warm-up: allocator, pinned buffers, the first log boundaries
        step(i, True)
        step(i, False)
    counter = cupti_counter()
    try:
        counts = {True: [], False: []}
        for i in range(25, 45):  # steps 26..45 with the agent; 30 and 40 are log boundaries
            for mode in (True, False):
                before = counter.total
                step(i, mode)
                counts[mode].append(counter.total - before)
        sites = dict(counter.sites)
    finally:
        counter.uninstall()
    agent.close()
    print(f"syncs per step, agent on: {counts[True]}; off: {counts[False]}; sites: {sites}")
    assert counts[True] == counts[False], sites


def test_nvml_telemetry_reports_a_busy_gpu():
    from packscope.agent.nvml import NvmlSampler

    sampler = NvmlSampler.try_start(0)
    assert sampler is not None, "nvidia-ml-py should be importable on the GPU machine"
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    sampler.take()
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 1.0:
        for _ in range(20):
            x = (x @ x).clamp_(-1, 1)
        torch.cuda.synchronize()
    got = sampler.take()
    sampler.close()
    print(f"nvml: {got}")
    assert got["gpu_util_pct"] > 50 and got["gpu_power_w"] > 100 and got["gpu_sm_clock_mhz"] > 500
    assert got["gpu_energy_j"] > 50  # over a second at > 100 W
