"""The agent on CPU: records, timing bookkeeping, and the sender's spool against a real HTTP peer."""

import gzip
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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
