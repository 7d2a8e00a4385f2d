"""The agent on CPU: records, timing bookkeeping, and the sender's spool against a real HTTP peer."""

import dataclasses
import gzip
import json
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from packscope.agent import Agent, AgentConfig, ModelSpec

MODEL = ModelSpec(layers=2, hidden=64, heads=4, ffn=128, vocab=256)


def run_steps(agent, steps, packs=((100, 200), (150, 62))):
    for i in range(steps):
        agent.step_begin()
        cu = [0]
        for p, docs in enumerate(packs):
            for d in docs:
                cu.append(cu[-1] + d)
            cu.append((p + 1) * 512) if cu[-1] < (p + 1) * 512 else None
        agent.observe_batch(
            cu_seqlens=torch.tensor(cu, dtype=torch.int32),
            shape=(len(packs), 512),
            token_mask=torch.ones(len(packs) * 512, dtype=torch.bool),
        )
        agent.step_end(loss=torch.tensor(3.0 - 0.1 * i), lr=1e-3)


def test_records_cover_every_step_once_with_exact_sums():
    agent = Agent(AgentConfig(log_every=4, count_syncs=False), model=MODEL)
    run_steps(agent, 10)
    agent.close()
    recs = list(agent.records)
    assert [r["interval"] for r in recs] == [0, 1, 2]
    assert [(r["first_step"], r["last_step"], r["steps"]) for r in recs] == [(1, 4, 4), (5, 8, 4), (9, 10, 2)]
    for r in recs:
        n = r["steps"]
        # The padding after each pack's documents is its own sequence in cu_seqlens but all
        # tokens are real per the mask, so that gap counts as a document: 3 documents per pack.
        docs = [100, 200, 212, 150, 62, 300]
        assert r["tokens"] == 1024 * n and r["packs"] == 2 * n
        assert r["real_tokens"] == sum(docs) * n and r["documents"] == 6 * n
        assert r["seqlen_sq_sum_bshd"] == 2 * 512**2 * n
        assert r["seqlen_sq_sum_thd"] == sum(d * d for d in docs) * n
        assert r["flops_thd"] == MODEL.flops(r["tokens"], r["seqlen_sq_sum_thd"])
        assert r["flops_bshd"] >= r["flops_thd"] >= r["flops_useful"]
        assert r["gpu_time_s"] >= r["step_time_max_s"] >= r["step_time_p50_s"] > 0
        assert r["syncs"]["total"] == 0
    assert recs[0]["loss"] == pytest.approx((3.0 + 2.9 + 2.8 + 2.7) / 4)
    assert recs[2]["loss"] == pytest.approx((2.2 + 2.1) / 2)


def test_steps_between_boundaries_poll_nothing():
    # The hot path: once an interval's record is out, ordinary steps make no timing query
    # until the next boundary (on CPU the host clock resolves a step at once).
    agent = Agent(AgentConfig(log_every=5, count_syncs=False), model=MODEL)
    polled_at = []
    poll = agent._timer.poll
    agent._timer.poll = lambda: polled_at.append(agent.step) or poll()
    run_steps(agent, 12)
    assert polled_at == [5, 10]
    assert [r["last_step"] for r in agent.records] == [5, 10]
    agent.close()
    assert [r["first_step"] for r in agent.records] == [1, 6, 11]


COUNTED = ("interval", "first_step", "last_step", "steps", "tokens", "real_tokens", "packs", "documents",
           "seqlen_sq_sum_bshd", "seqlen_sq_sum_thd", "histograms", "loss", "lr", "grad_norm")  # fmt: skip


def run_kept_steps(agent, steps, hook_finishes):
    """An integration's pattern (integrations/hf.py): each step's batch is kept by reference when
    the step ends and observed at the boundary (before_boundary); with defer_boundary the
    integration finishes the ended interval in the next step's first forward (`hook_finishes`),
    or, at the latest, before it keeps the next step's batch."""
    kept = []

    def observe_kept():
        for cu in kept:
            agent.observe_batch(cu_seqlens=cu, shape=(1, 512))
        kept.clear()

    agent.before_boundary = observe_kept
    for i in range(steps):
        agent.step_begin()
        if hook_finishes:
            agent.finish_boundary()
        agent.finish_boundary()  # the step's end: the last interval's batches before this one's
        kept.append(torch.tensor([0, 10 + 7 * i, 100 + i, 512]))
        agent.step_end(loss=torch.tensor(3.0 - 0.1 * i), lr=1e-3 * (i + 1), grad_norm=float(i))
    agent.close()
    return [{key: r[key] for key in COUNTED} for r in agent.records]


@pytest.mark.parametrize("hook_finishes", [True, False], ids=["in-the-next-forward", "at-the-next-step-end"])
def test_a_deferred_boundary_gives_the_records_of_an_immediate_one(hook_finishes):
    def agent(defer):
        a = Agent(AgentConfig(log_every=3, count_syncs=False), model=MODEL)
        a.defer_boundary = defer
        return a

    immediate = run_kept_steps(agent(False), 9, hook_finishes)
    deferred = agent(True)
    records = run_kept_steps(deferred, 9, hook_finishes)  # the last boundary (9) is finished by close
    assert [(r["first_step"], r["last_step"]) for r in records] == [(1, 3), (4, 6), (7, 9)]
    assert records == immediate
    docs = [(10 + 7 * i, 90 - 6 * i, 412 - i) for i in (3, 4, 5)]  # the second interval's steps
    assert records[1]["documents"] == 9
    assert records[1]["seqlen_sq_sum_thd"] == sum(d * d for step in docs for d in step)


def test_a_deferred_boundary_waits_for_finish_boundary():
    agent = Agent(AgentConfig(log_every=2, count_syncs=False), model=MODEL)
    agent.defer_boundary = True
    for _ in range(2):
        agent.step_begin()
        agent.observe_batch(shape=(2, 64))
        agent.step_end()
    assert agent._ended is not None and not agent._inflight  # the boundary took host facts only
    agent.step_begin()
    agent.finish_boundary()
    assert agent._ended is None and len(agent._inflight) == 1
    agent.observe_batch(shape=(1, 64))
    agent.step_end()
    agent.close()
    assert [(r["first_step"], r["last_step"], r["tokens"]) for r in agent.records] == [(1, 2, 256), (3, 3, 64)]


def test_float_loss_and_grad_norm_are_accepted():
    agent = Agent(AgentConfig(log_every=2, count_syncs=False), model=MODEL)
    for i in range(2):
        agent.step_begin()
        agent.observe_batch(shape=(2, 64))
        agent.step_end(loss=1.0 + i, grad_norm=0.5)
    agent.close()
    (r,) = agent.records
    assert r["loss"] == pytest.approx(1.5) and r["grad_norm"] == pytest.approx(0.5)
    assert r["real_tokens"] == r["tokens"] == 2 * 2 * 64 and r["documents"] == 4


def test_observe_batch_refuses_ambiguous_input():
    agent = Agent(AgentConfig(count_syncs=False), model=MODEL)
    agent.step_begin()
    with pytest.raises(ValueError, match="needs shape"):
        agent.observe_batch(cu_seqlens=torch.tensor([0, 4]))
    with pytest.raises(ValueError, match="needs cu_seqlens"):
        agent.observe_batch()


class Peer:
    """A real HTTP server on loopback that stores what it receives and can be told to fail."""

    def __init__(self):
        self.intervals: list[dict] = []
        self.keys: set = set()
        self.patches: list[dict] = []
        self.heartbeats: list[dict] = []
        self.refusals: list[dict] = []
        self.runs: set[str] = set()
        self.fail = False
        self.reject_intervals: set[int] = set()  # answer 422 to batches holding these
        self.delay_s = 0.0
        peer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _body(self):
                raw = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    raw = gzip.decompress(raw)
                return json.loads(raw)

            def _answer(self, code, obj):
                data = json.dumps(obj).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                body = self._body()
                time.sleep(peer.delay_s)
                if peer.fail:
                    return self._answer(503, {"detail": "down"})
                for kind, kept in (("/heartbeat", peer.heartbeats), ("/refusals", peer.refusals)):
                    if self.path.endswith(kind):
                        if self.path.split("/")[-2] not in peer.runs:
                            return self._answer(404, {"detail": "unknown run"})
                        kept.extend(body["refusals"] if kind == "/refusals" else [body])
                        return self._answer(200, {})
                if self.path.endswith("/intervals"):
                    if self.path.split("/")[-2] not in peer.runs:
                        return self._answer(404, {"detail": "unknown run"})
                    if any(r["interval"] in peer.reject_intervals for r in body["intervals"]):
                        return self._answer(422, {"detail": "invalid record"})
                    acc = dup = 0
                    for r in body["intervals"]:
                        key = (r["rank"], r["interval"])
                        if key in peer.keys:
                            dup += 1
                        else:
                            peer.keys.add(key)
                            peer.intervals.append(r)
                            acc += 1
                    return self._answer(200, {"accepted": acc, "duplicates": dup})
                peer.runs.add(body["run_id"])
                return self._answer(201, body)

            def do_PATCH(self):
                peer.patches.append(self._body())
                self._answer(200, {})

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()


@pytest.fixture
def peer():
    p = Peer()
    yield p
    p.close()


def test_outage_spools_then_replays_in_order_exactly_once(peer, tmp_path):
    cfg = AgentConfig(server=peer.url, log_every=1, count_syncs=False, spool_dir=str(tmp_path))
    agent = Agent(cfg, model=MODEL)
    agent.sender.retry_s = 0.05
    run_steps(agent, 3)
    time.sleep(0.3)
    peer.fail = True
    run_steps(agent, 4)
    time.sleep(0.3)
    assert len(agent.sender.spool) > 0  # the outage went to disk, not lost
    peer.fail = False
    run_steps(agent, 3)
    assert agent.close(timeout_s=10)
    assert [r["interval"] for r in peer.intervals] == list(range(10))
    assert peer.patches[-1]["status"] == "finished"
    assert len(agent.sender.spool) == 0


@pytest.mark.alone  # the steps are timed against the wall clock
def test_a_slow_server_never_blocks_the_step(peer, tmp_path):
    peer.delay_s = 1.0
    agent = Agent(AgentConfig(server=peer.url, log_every=1, count_syncs=False, spool_dir=str(tmp_path)), model=MODEL)
    t0 = time.perf_counter()
    run_steps(agent, 5)
    assert time.perf_counter() - t0 < 0.9  # five records handed over while one request takes 1 s
    peer.delay_s = 0.0
    assert agent.close(timeout_s=20)
    assert len(peer.intervals) == 5


def test_a_server_that_lost_the_run_gets_it_registered_again(peer, tmp_path):
    agent = Agent(AgentConfig(server=peer.url, log_every=1, count_syncs=False, spool_dir=str(tmp_path)), model=MODEL)
    agent.sender.retry_s = 0.05
    run_steps(agent, 3)
    time.sleep(0.3)
    peer.runs.clear()  # e.g. the server restarted on a fresh database
    run_steps(agent, 3)
    assert agent.close(timeout_s=10)
    assert [r["interval"] for r in peer.intervals] == list(range(6))


def test_a_resumed_run_continues_steps_and_intervals():
    agent = Agent(AgentConfig(log_every=5, count_syncs=False, run_id="resumed-1", start_step=20), model=MODEL)
    run_steps(agent, 7)
    agent.close()
    assert agent.run_id == "resumed-1"
    assert [(r["interval"], r["first_step"], r["last_step"]) for r in agent.records] == [(4, 21, 25), (5, 26, 27)]
    assert all(r["timing_lag_steps"] >= 0 for r in agent.records)


# -- sampled sync counting -------------------------------------------------------------------------
def run_syncing_steps(agent, steps, syncs_per_step=3):
    """Steps that each sync `syncs_per_step` times at one site, as the counter records a sync (on the
    CPU no sync warning comes from torch: tests/agent/test_syncs.py covers the warning path)."""
    for _ in range(steps):
        agent.step_begin()
        agent.observe_batch(shape=(1, 64))
        for _ in range(syncs_per_step):
            agent.syncs.record("train.py:7")
        agent.step_end()


@pytest.mark.parametrize("start_step", [0, 30])
def test_syncs_are_counted_in_the_first_two_intervals_then_one_in_count_syncs_every(start_step):
    agent = Agent(AgentConfig(log_every=2, count_syncs_every=3, start_step=start_step), model=MODEL)
    run_syncing_steps(agent, 2 * 10 + 1)  # ten intervals and a last one of one step
    agent.close()
    first = start_step // 2
    counted = [r["interval"] - first for r in agent.records if r["syncs"]["uncounted_steps"] == 0]
    assert counted == [0, 1, 4, 7, 10]  # the first two, then every third from the second
    for r in agent.records:
        if r["interval"] - first in counted:
            assert r["syncs"]["total"] == 3 * r["steps"]
            assert r["syncs"]["sites"] == [{"site": "train.py:7", "count": 3 * r["steps"]}]
        else:  # no count, and the record says so: 0 syncs over steps that were not counted
            assert r["syncs"] == {"total": 0, "uncounted_steps": r["steps"], "sites": []}


def test_every_interval_is_counted_with_count_syncs_every_1_and_none_without_counting():
    every = Agent(AgentConfig(log_every=2, count_syncs_every=1), model=MODEL)
    run_syncing_steps(every, 12)
    every.close()
    assert [r["syncs"]["total"] for r in every.records] == [6] * 6
    assert all(r["syncs"]["uncounted_steps"] == 0 for r in every.records)
    off = Agent(AgentConfig(log_every=2, count_syncs=False), model=MODEL)
    run_syncing_steps(off, 4)
    off.close()
    # Not "no syncs": none counted.
    assert [r["syncs"] for r in off.records] == [{"total": 0, "uncounted_steps": 2, "sites": []}] * 2


def test_count_syncs_every_must_be_positive():
    with pytest.raises(ValueError, match="count_syncs_every must be >= 1"):
        AgentConfig(count_syncs_every=0)


# -- liveness, the layout the batches had, the baseline's pack length ---------------------------------
def wait_until(condition, timeout_s=10.0, what="the condition"):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.02)


def test_rank_0_beats_from_the_sender_thread_from_its_start(peer, tmp_path):
    cfg = AgentConfig(server=peer.url, log_every=100, count_syncs=False, spool_dir=str(tmp_path), heartbeat_s=0.2)
    agent = Agent(cfg, model=MODEL)
    # Registered and beating before any interval: a long first interval (compiling) is not silence.
    wait_until(lambda: len(peer.heartbeats) >= 3, what="three heartbeats")
    assert agent.run_id in peer.runs and peer.intervals == []
    assert all(beat == {"every_s": 0.2} for beat in peer.heartbeats)
    run_steps(agent, 3)
    assert agent.close(timeout_s=10)
    beats = len(peer.heartbeats)
    time.sleep(0.5)
    assert len(peer.heartbeats) == beats  # a closed run is silent, and its status says why


def test_no_heartbeat_when_asked_for_none(peer, tmp_path):
    cfg = AgentConfig(server=peer.url, log_every=1, count_syncs=False, spool_dir=str(tmp_path), heartbeat_s=0)
    agent = Agent(cfg, model=MODEL)
    run_steps(agent, 3)
    assert agent.close(timeout_s=10)
    assert peer.heartbeats == [] and len(peer.intervals) == 3


def test_a_server_url_without_a_scheme_is_refused_at_once():
    for bad in ("localhost:8000", "127.0.0.1:8000", "http://", "ftp://host", "http://host:port"):
        with pytest.raises(ValueError, match="must be a URL like http://"):
            AgentConfig(server=bad)
    assert AgentConfig(server="http://127.0.0.1:8000/").server == "http://127.0.0.1:8000"


def test_the_run_url_is_announced_on_rank_0(peer, tmp_path, capsys):
    agent = Agent(AgentConfig(server=peer.url, run_id="seen-1", spool_dir=str(tmp_path)), model=MODEL)
    agent.announce()
    assert capsys.readouterr().err == f"packscope: run seen-1: {peer.url}/runs/seen-1\n"
    agent.close(timeout_s=5)
    assert Agent(AgentConfig(count_syncs=False), model=MODEL).run_url is None


def observe_padded(agent, steps):
    for _ in range(steps):
        agent.step_begin()
        agent.observe_batch(attention_mask=torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0]]))
        agent.step_end(loss=1.0)


def test_the_layout_is_what_the_batches_were_not_what_was_declared(peer, tmp_path, caplog):
    cfg = AgentConfig(server=peer.url, log_every=2, count_syncs=False, spool_dir=str(tmp_path), layout="thd")
    agent = Agent(cfg, model=MODEL)
    with caplog.at_level("WARNING", logger="packscope.agent"):
        observe_padded(agent, 4)
    assert agent.layout_seen == "bshd"
    assert "declared layout 'thd', but its batches are padded rows (bshd)" in caplog.text
    wait_until(lambda: {"layout": "bshd"} in peer.patches, what="the layout PATCH")
    run_steps(agent, 2)  # cu_seqlens with a token mask: static THD
    assert agent.layout_seen == "mixed"
    assert agent.close(timeout_s=10)
    layouts = [p["layout"] for p in peer.patches if "layout" in p]
    assert layouts == ["bshd", "mixed"]  # once when known, once when it changed
    assert peer.patches[-1]["status"] == "finished"


@pytest.mark.parametrize(
    ("observe", "kind"),
    [
        (lambda a: a.observe_batch(cu_seqlens=torch.tensor([0, 3, 8]), shape=(1, 8)), "thd"),
        (lambda a: a.observe_batch(cu_seqlens=[0, 3, 8], shape=(1, 8), token_mask=torch.ones(8)), "thd-static"),
        (lambda a: a.observe_batch(position_ids=torch.tensor([0, 1, 2, 0, 1])), "thd"),
        (lambda a: a.observe_batch(attention_mask=torch.ones(2, 4)), "bshd"),
        (lambda a: a.observe_batch(shape=(2, 4)), "bshd"),
    ],
)
def test_each_batch_form_has_its_layout(observe, kind):
    agent = Agent(AgentConfig(log_every=1, count_syncs=False), model=MODEL)
    agent.step_begin()
    observe(agent)
    agent.step_end()
    assert agent.layout_seen == kind
    agent.close()


def trl_packed_batch(agent, packs, pack_length):
    """What TRL's packing hands the model: the packs' documents flattened into one row."""
    positions = [i for pack in packs for doc in pack for i in range(doc)]
    assert all(sum(pack) <= pack_length for pack in packs)
    agent.observe_batch(position_ids=torch.tensor([positions]))


def test_a_known_pack_length_makes_the_baseline_count_its_packs(peer, tmp_path):
    packs = [[600, 424], [1000], [512, 500], [1021]]  # 4 packs of at most 1024: 4081 tokens in one row
    docs = [d for pack in packs for d in pack]
    row = sum(docs)
    records = {}
    for pack_length in (None, 1024):
        cfg = AgentConfig(server=peer.url, log_every=1, count_syncs=False, spool_dir=str(tmp_path))
        agent = Agent(dataclasses.replace(cfg, pack_length=pack_length), model=MODEL)
        agent.step_begin()
        trl_packed_batch(agent, packs, 1024)
        agent.step_end()
        assert agent.close(timeout_s=10)
        (records[pack_length],) = agent.records
    flat, packed = records[None], records[1024]
    assert flat["seqlen_sq_sum_bshd"] == row * row  # the row as one sequence: the 192% over-count
    assert packed["seqlen_sq_sum_bshd"] == 4 * 1024 * 1024  # four packs of 1024, as TRL counts them
    for r in (flat, packed):
        assert r["seqlen_sq_sum_thd"] == sum(d * d for d in docs) and r["tokens"] == row and r["packs"] == 1
    assert packed["flops_bshd"] == MODEL.flops(row, 4 * 1024 * 1024)
    assert {"layout": "thd", "pack_length": 1024, "pack_length_from": "AgentConfig.pack_length"} in peer.patches


def test_a_pack_length_leaves_padded_rows_alone():
    agent = Agent(AgentConfig(log_every=1, count_syncs=False, pack_length=2), model=MODEL)
    observe_padded(agent, 1)
    agent.close()
    (r,) = agent.records
    assert r["seqlen_sq_sum_bshd"] == 2 * 4 * 4  # padded rows are dense sequences as they are


# -- bad input stops where it was made ------------------------------------------------------------
def test_python_sequences_are_counted_like_tensors():
    got = []
    forms = (torch.tensor([0, 3, 8, 8, 10], dtype=torch.int32), [0, 3, 8, 8, 10], (0, 3, 8, 8, 10), range(0, 12, 4))
    for form in forms:
        agent = Agent(AgentConfig(log_every=1, count_syncs=False), model=MODEL)
        agent.step_begin()
        agent.observe_batch(cu_seqlens=form, shape=(2, 6))
        agent.observe_batch(position_ids=[[0, 1, 2, 0, 1]], attention_mask=[[1, 1, 1, 1, 0]])
        agent.step_end()
        agent.close()
        (r,) = agent.records
        got.append({k: r[k] for k in ("tokens", "real_tokens", "documents", "packs", "seqlen_sq_sum_thd")})
    assert (
        got[0]
        == got[1]
        == got[2]
        == {
            "tokens": 17,
            "real_tokens": 14,
            "documents": 5,
            "packs": 3,
            "seqlen_sq_sum_thd": 9 + 25 + 4 + 9 + 1,
        }
    )
    assert (got[3]["documents"], got[3]["real_tokens"]) == (4, 12)  # range(0, 12, 4): two of 4, and the row


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"cu_seqlens": [0, 5, 3, 8], "shape": (1, 8)}, ValueError, r"cu_seqlens must not decrease, but entry 2 \(3\)"),
        ({"cu_seqlens": [0, 5, 9], "shape": (1, 8)}, ValueError, r"cu_seqlens must stay within 0\.\.8"),
        ({"cu_seqlens": [-1, 5], "shape": (1, 8)}, ValueError, r"cu_seqlens must stay within 0\.\.8"),
        ({"cu_seqlens": [[0, 5]], "shape": (1, 8)}, ValueError, r"cu_seqlens must be 1-D"),
        ({"cu_seqlens": [0, 2.5], "shape": (1, 8)}, TypeError, "cu_seqlens must hold whole numbers"),
        ({"cu_seqlens": "0,5", "shape": (1, 8)}, TypeError, "cu_seqlens must be a tensor or a sequence"),
        ({"cu_seqlens": torch.tensor([0.0, 5.0]), "shape": (1, 8)}, TypeError, "cu_seqlens must hold integers"),
        ({"cu_seqlens": [], "shape": (1, 8)}, ValueError, "cu_seqlens must have at least one entry"),
        (
            {"cu_seqlens": [0, 4, 8], "cu_seqlens_padded": [0, 3, 8], "shape": (1, 8)},
            ValueError,
            r"cu_seqlens_padded must hold every sequence of cu_seqlens, but sequence 0 is 3 slots",
        ),
        ({"cu_seqlens": [0, 4], "shape": (1,)}, ValueError, r"shape must be \(rows, row_len\)"),
        ({"position_ids": [[[0, 1]]]}, ValueError, r"position_ids must be 1-D or 2-D"),
        ({"position_ids": [0, 1], "attention_mask": {"a": 1}}, TypeError, "attention_mask must be a tensor"),
        ({"attention_mask": [1, 1, 0]}, ValueError, r"attention_mask must be 2-D"),
    ],
)
def test_bad_input_is_refused_at_the_call_naming_the_argument(kwargs, error, message):
    agent = Agent(AgentConfig(count_syncs=False), model=MODEL)
    agent.step_begin()
    with pytest.raises(error, match=message):
        agent.observe_batch(**kwargs)
    agent.close()


@pytest.mark.parametrize(
    ("cu", "padded", "problem"),
    [
        ([0, 700, 500, 1024], None, "cu_seqlens decreases"),  # what gave "real_tokens (1424) exceeds tokens (1024)"
        ([0, 600, 1200], None, "past the batch's token slots"),
        ([0, 600, 1024], [0, 500, 1024], "cu_seqlens_padded holds a sequence shorter"),
    ],
)
def test_a_bad_cu_seqlens_tensor_refuses_its_interval_at_the_host(peer, tmp_path, caplog, cu, padded, problem):
    cfg = AgentConfig(server=peer.url, log_every=2, count_syncs=False, spool_dir=str(tmp_path))
    agent = Agent(cfg, model=MODEL)
    with caplog.at_level("WARNING", logger="packscope.agent"):
        run_steps(agent, 2)  # a good interval
        for _ in range(4):  # two bad ones: accepted at the call (reading the values would sync)
            agent.step_begin()
            agent.observe_batch(
                cu_seqlens=torch.tensor(cu),
                cu_seqlens_padded=None if padded is None else torch.tensor(padded),
                shape=(1, 1024),
            )
            agent.step_end(loss=1.0)
        run_steps(agent, 2)  # and a good one again
        assert agent.close(timeout_s=10)
    assert [r["interval"] for r in peer.intervals] == [0, 3]  # the bad ones are not sent...
    assert [(r["interval"], r["first_step"], r["last_step"], r["by"]) for r in peer.refusals] == [
        (1, 3, 4, "agent"),
        (2, 5, 6, "agent"),
    ]  # ...the server is told why
    assert all(problem in r["reason"] for r in peer.refusals)
    marked = [r for r in agent.records if "refused" in r]
    assert [r["interval"] for r in marked] == [1, 2] and agent.refused == 2
    warnings = [m for m in caplog.messages if "not sent" in m and "interval" in m]
    assert len([m for m in warnings if "interval 1 (steps 3-4)" in m]) == 1  # named once, with its steps
    assert not any("interval 2 (" in m for m in warnings)


def test_ordinary_steps_read_nothing_back_whatever_the_form(monkeypatch):
    """No .item()/.tolist()/bool()/float() on a tensor from agent code except at a log boundary, for
    tensors and Python sequences alike (a sequence is checked in Python, not on the device)."""
    agent_dir = str(Path(__file__).resolve().parents[2] / "agent")
    reads: list[int] = []
    agent = Agent(AgentConfig(log_every=3, count_syncs=False), model=MODEL)
    for name in ("item", "tolist", "__bool__", "__int__", "__float__", "cpu", "numpy"):
        original = getattr(torch.Tensor, name)

        def read(self, *args, _original=original, **kwargs):
            if sys._getframe(1).f_code.co_filename.startswith(agent_dir):
                reads.append(agent.step)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, read)
    for _ in range(7):
        agent.step_begin()
        agent.observe_batch(cu_seqlens=torch.tensor([0, 3, 8]), shape=(1, 8))
        agent.observe_batch(cu_seqlens=[0, 2, 6], cu_seqlens_padded=[0, 4, 8], shape=(1, 8))
        agent.observe_batch(position_ids=[[0, 1, 2, 0, 1]], attention_mask=torch.ones(1, 5))
        agent.observe_batch(attention_mask=[[1, 1, 0]])
        agent.step_end(loss=torch.tensor(1.0))
    agent.close()
    monkeypatch.undo()
    assert reads, "the spy saw no read at all: it would not see one on an ordinary step either"
    assert set(reads) <= {3, 6, 7}, reads  # the boundaries (3, 6) and close (7) only
    assert [r["documents"] for r in agent.records] == [3 * 7, 3 * 7, 7]


# -- the process ends: SIGTERM and unhandled exceptions mark the run failed -----------------------------
ENDING = """
import os, signal, sys, time
import torch
from packscope.agent import Agent, AgentConfig, ModelSpec

url, spool, mode = sys.argv[1:4]
if mode == "own-handler":  # a trainer that checkpoints on SIGTERM and carries on
    signal.signal(signal.SIGTERM, lambda signum, frame: print("the trainer's handler ran", flush=True))
elif mode == "ignored":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
cfg = AgentConfig(server=url, run_id="ending-" + mode, log_every=2, count_syncs=False, spool_dir=spool, heartbeat_s=0.2)
agent = Agent(cfg, model=ModelSpec(layers=2, hidden=64, heads=4, ffn=128, vocab=256))

def steps(n):
    for _ in range(n):
        agent.step_begin()
        agent.observe_batch(shape=(2, 8))
        agent.step_end(loss=1.0)

steps(4)
time.sleep(0.5)  # the records reach the server
if mode == "exception":
    raise RuntimeError("boom in the training loop")
os.kill(os.getpid(), signal.SIGTERM)
time.sleep(0.3)
steps(2)
print("carried on", flush=True)
agent.close()
"""


def end_a_process(peer, tmp_path, mode):
    script = tmp_path / "ending.py"
    script.write_text(ENDING)
    done = subprocess.run(
        [sys.executable, str(script), peer.url, str(tmp_path / "spool"), mode],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done, [p["status"] for p in peer.patches if "status" in p]


@pytest.mark.slow  # a fresh interpreter imports torch per case
def test_sigterm_marks_the_run_failed_and_the_process_still_ends(peer, tmp_path):
    done, statuses = end_a_process(peer, tmp_path, "default")
    assert done.returncode == -signal.SIGTERM, done.stderr  # ended by the signal, as without the agent
    assert "carried on" not in done.stdout
    assert statuses == ["failed"]
    assert [r["interval"] for r in peer.intervals] == [0, 1]


@pytest.mark.slow
def test_sigterm_chains_to_the_trainers_handler_and_a_survivor_runs_again(peer, tmp_path):
    done, statuses = end_a_process(peer, tmp_path, "own-handler")
    assert done.returncode == 0, done.stderr
    assert "the trainer's handler ran" in done.stdout and "carried on" in done.stdout
    assert statuses == ["failed", "running", "finished"]


@pytest.mark.slow
def test_an_ignored_sigterm_marks_nothing(peer, tmp_path):
    done, statuses = end_a_process(peer, tmp_path, "ignored")
    assert done.returncode == 0, done.stderr
    assert statuses == ["finished"]


@pytest.mark.slow
def test_an_unhandled_exception_prints_its_traceback_then_marks_the_run_failed(peer, tmp_path):
    done, statuses = end_a_process(peer, tmp_path, "exception")
    assert done.returncode == 1
    assert "RuntimeError: boom in the training loop" in done.stderr
    assert statuses == ["failed"]
    assert [r["interval"] for r in peer.intervals] == [0, 1]
