"""A sliding-window model trained by the reference trainer: the agent's window sum is the one its
documents give, and its THD-corrected FLOPs stand next to what packscope counted before it read
windows (every layer full attention), on the same documents."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

from packscope.core.run_file import read_run_file
from packscope.trainer.config import DataConfig, TrainConfig
from packscope.trainer.train import Trainer, run_training

WINDOW = 48
# Documents of 8 to 256 tokens, most of them longer than the window.
DOCS = DataConfig(min_len=8, short_share=0.3, short_median=24, long_median=160)


@pytest.fixture(autouse=True)
def _one_intra_op_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _config(tmp_path, name: str, **overrides) -> TrainConfig:
    base = dict(
        steps=6, log_every=3, pack_length=256, packs_per_step=2, device="cpu", progress=False, data=DOCS, window=WINDOW
    )
    return TrainConfig(**{**base, **overrides, "records_dir": str(tmp_path / name)})


def _window_sq(s: int) -> int:
    """Causal pairs under a window W in the s²/2 convention (docs/flops.md): s² up to W."""
    return s * s if s <= WINDOW else 2 * s * WINDOW - WINDOW * WINDOW


def test_a_windowed_run_counts_its_window_and_stands_beside_the_full_attention_count(tmp_path):
    windowed = _config(tmp_path, "windowed")
    old = _config(tmp_path, "as-full", count_window_as_full=True)
    for cfg in (windowed, old):
        run_training(cfg)
    new_records = read_run_file(tmp_path / "windowed" / "rank0.jsonl").records
    old_records = read_run_file(tmp_path / "as-full" / "rank0.jsonl").records

    # The documents, drawn again by a trainer of the same config, independently of the agent.
    replay = Trainer(windowed)
    lengths = [[s for b in replay.next_batches() for s in b.doc_lengths] for _ in range(windowed.steps)]
    spec = windowed.model.to_model_spec()
    c_window = spec.c_core_by_sum["window_sq_sum_thd"]
    assert set(spec.kinds) == {"sliding"} and c_window == 6 * spec.layers * spec.hidden  # q = n·d = h
    for k, (new, was) in enumerate(zip(new_records, old_records, strict=True)):
        docs = [s for step in lengths[3 * k : 3 * k + 3] for s in step]
        assert new["seqlen_sq_sum_thd"] == was["seqlen_sq_sum_thd"] == sum(s * s for s in docs)
        assert new["window_sq_sum_thd"] == sum(_window_sq(s) for s in docs) < new["seqlen_sq_sum_thd"]
        assert new["window_sq_sum_bshd"] == new["packs"] * _window_sq(windowed.pack_length)
        assert was["window_sq_sum_thd"] == 0  # the old count had no window term
        assert new["flops_thd"] == new["tokens"] * spec.c_lin + new["window_sq_sum_thd"] * c_window
        assert was["flops_thd"] == was["tokens"] * spec.c_lin + was["seqlen_sq_sum_thd"] * c_window
        # The same work counted both ways: the old count over-reports it.
        assert was["flops_thd"] > new["flops_thd"]
