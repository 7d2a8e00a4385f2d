"""The reference trainer under torchrun with 2 gloo ranks, DDP and FSDP2.

Each layout is one `python -m torch.distributed.run --nproc-per-node 2` of a small launcher
that runs `packscope train --parallel ... --records-dir ...` with every torch.distributed
collective wrapped: a call made while the agent's code is on the stack is counted. The test
process then checks every rank's records against brute force over the rank's seeded documents.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from packscope.agent.histograms import NUM_BUCKETS
from packscope.core.run_file import read_run_file
from packscope.trainer.config import DataConfig, TrainConfig
from packscope.trainer.data import DocumentStream, step_documents
from packscope.trainer.distributed import Parallel

pytestmark = [
    pytest.mark.slow,  # about 25 s a layout on a 2-core machine, mostly process start-up
    pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()), reason="needs gloo"),
]

WORLD = 2
STEPS, LOG_EVERY = 6, 2
ARGS = dict(
    preset="tiny",
    device="cpu",
    steps=STEPS,
    log_every=LOG_EVERY,
    pack_length=128,
    packs_per_step=4,
    micro_batches=2,
    seed=5,
    data=DataConfig(min_len=8, short_median=24, long_median=96),
)
COUNT_KEYS = ("tokens", "real_tokens", "packs", "documents", "seqlen_sq_sum_bshd", "seqlen_sq_sum_thd")

LAUNCHER = """
import sys, json, os, traceback
import torch.distributed as dist
from packscope.agent import agent as agent_module
from packscope.commands.cli import main

# Count collectives started while the agent's code runs (its constructor's run-id broadcast aside).
calls, inside = [], [0]
for name in ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "reduce",
             "reduce_scatter_tensor", "broadcast", "broadcast_object_list", "barrier", "all_to_all_single"):
    original = getattr(dist, name)
    def counted(*a, _name=name, _original=original, **k):
        if inside[0]:
            calls.append(_name)
        return _original(*a, **k)
    setattr(dist, name, counted)
for method in ("step_begin", "observe_batch", "step_end", "close"):
    original = getattr(agent_module.Agent, method)
    def traced(self, *a, _original=original, **k):
        inside[0] += 1
        try:
            return _original(self, *a, **k)
        finally:
            inside[0] -= 1
    setattr(agent_module.Agent, method, traced)
code = main(sys.argv[1:])
out = sys.argv[sys.argv.index("--records-dir") + 1]
with open(os.path.join(out, f"collectives{os.environ['RANK']}.json"), "w") as f:
    json.dump(calls, f)
sys.exit(code)
"""


def _flags(args: dict) -> list[str]:
    flags = []
    for key, value in args.items():
        if key == "data":
            flags += [f"--data-{k.replace('_', '-')}={v}" for k, v in vars(value).items()]
        else:
            flags.append(f"--{key.replace('_', '-')}={value}")
    return flags


@pytest.fixture(scope="module", params=["ddp", "fsdp2"])
def layout_run(request, tmp_path_factory) -> tuple[str, Path, list[dict]]:
    kind = request.param
    root = tmp_path_factory.mktemp(kind)
    launcher = root / "launch.py"
    launcher.write_text(LAUNCHER)
    out = root / "records"
    out.mkdir()
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={WORLD}",
        str(launcher),
        "train",
        f"--parallel={kind}",
        "--no-progress",
        "--records-dir",
        str(out),
        *_flags(ARGS),
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env, cwd=root)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    summaries = _json_objects(done.stdout)
    return kind, out, summaries


def _json_objects(text: str) -> list[dict]:
    """The summaries the ranks printed: every JSON object that starts a line. Decoded in place
    rather than split by lines, since two ranks share one stdout and their outputs may abut."""
    decoder, objects, at = json.JSONDecoder(), [], 0
    while (at := text.find("{", at)) != -1:
        if at == 0 or text[at - 1] == "\n" or text[at - 1] == "}":
            try:
                obj, end = decoder.raw_decode(text, at)
            except json.JSONDecodeError:
                at += 1
                continue
            if isinstance(obj, dict) and "rank" in obj:
                objects.append(obj)
            at = end
        else:
            at += 1
    return objects


def _bucket(length: int) -> int:
    return min(length.bit_length() - 1, NUM_BUCKETS - 1)


def brute_intervals(rank: int) -> list[dict]:
    """Per-interval counts of one rank's documents, one document at a time, from the seeded stream
    the trainer draws rank `rank`'s data from."""
    cfg = TrainConfig(**ARGS)
    seed = Parallel("ddp", rank=rank, world_size=WORLD).data_seed(cfg.seed)
    docs = DocumentStream(cfg.data, cfg.model.vocab, cfg.pack_length, seed)
    steps = step_documents(
        iter(docs), cfg.micro_batches, cfg.packs_per_micro_batch, cfg.pack_length, cfg.max_docs_per_pack, cfg.align
    )
    out = []
    for _ in range(STEPS // LOG_EVERY):
        c = dict.fromkeys(COUNT_KEYS, 0)
        hist = {"count": [0] * NUM_BUCKETS, "tokens": [0] * NUM_BUCKETS}
        for _ in range(LOG_EVERY):
            for group in next(steps):
                c["packs"] += cfg.packs_per_micro_batch
                c["tokens"] += cfg.packs_per_micro_batch * cfg.pack_length
                c["seqlen_sq_sum_bshd"] += cfg.packs_per_micro_batch * cfg.pack_length**2
                for doc in group:
                    n = len(doc)
                    c["documents"] += 1
                    c["real_tokens"] += n
                    c["seqlen_sq_sum_thd"] += n * n
                    hist["count"][_bucket(n)] += 1
                    hist["tokens"][_bucket(n)] += n
        out.append({**c, "doc_hist": hist})
    return out


def _records(out: Path, rank: int) -> list[dict]:
    return read_run_file(out / f"rank{rank}.jsonl").records


def test_the_ranks_train_on_different_documents():
    a, b = brute_intervals(0), brute_intervals(1)
    assert a[0]["real_tokens"] != b[0]["real_tokens"] or a[0]["doc_hist"] != b[0]["doc_hist"]


def test_every_rank_sends_its_own_records_and_their_sum_is_brute_force(layout_run):
    kind, out, summaries = layout_run
    assert sorted(s["rank"] for s in summaries) == list(range(WORLD))
    assert len({s["run_id"] for s in summaries}) == 1
    per_rank = [_records(out, r) for r in range(WORLD)]
    expected = [brute_intervals(r) for r in range(WORLD)]
    for rank, records in enumerate(per_rank):
        assert [r["interval"] for r in records] == list(range(STEPS // LOG_EVERY)), kind
        assert all(r["rank"] == rank and r["gpus"] == 1 and r["gpu_time_s"] > 0 for r in records)
        for rec, exp in zip(records, expected[rank], strict=True):
            assert {k: rec[k] for k in COUNT_KEYS} == {k: exp[k] for k in COUNT_KEYS}, (kind, rank)
            assert rec["histograms"]["documents"] == exp["doc_hist"], (kind, rank)
    for i in range(STEPS // LOG_EVERY):  # what the server's sums over ranks hold
        total = {k: sum(per_rank[r][i][k] for r in range(WORLD)) for k in COUNT_KEYS}
        assert total == {k: sum(expected[r][i][k] for r in range(WORLD)) for k in COUNT_KEYS}


def test_the_agent_adds_no_collective_and_no_sync(layout_run):
    kind, out, _ = layout_run
    for rank in range(WORLD):
        assert json.loads((out / f"collectives{rank}.json").read_text()) == [], (kind, rank)
        assert all(r["syncs"]["total"] == 0 for r in _records(out, rank)), (kind, rank)


def test_summaries_are_found_when_rank_outputs_abut():
    a, b = json.dumps({"rank": 0, "x": 1}, indent=2), json.dumps({"rank": 1, "x": 2}, indent=2)
    text = f"warning {{not json\n{a}{b}\n[rank1]: log line\n"
    assert [s["rank"] for s in _json_objects(text)] == [0, 1]
