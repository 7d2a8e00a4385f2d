"""bench/integration_overhead.py's ratio mode on CPU (the stand-in model): a smoke run of the code
path the GPU sessions rely on, which a change elsewhere (the FLOPs model refusing 0 layers) once
broke without any test noticing."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest

pytest.importorskip("transformers")
sys.path.insert(0, str(Path(__file__).parents[2] / "bench"))

import integration_overhead as bench


def test_ratio_runs_on_the_stand_in_and_times_gc_per_step():
    rounds, warmup = 3, 1
    result = bench.step_time_ratio("hf", rounds, warmup, "stand-in", "cpu", ("full",), gc_freeze=True)
    assert result["rounds"] == rounds
    # one entry per timed step, in the run's order, each mode once a round
    assert len(result["gc_ms_by_step"]) == 2 * rounds
    assert sorted(mode for mode, _ in result["gc_ms_by_step"]) == ["full"] * rounds + ["off"] * rounds
    assert all(ms >= 0 for _, ms in result["gc_ms_by_step"])
    assert result["gc_freeze"] is True
    ratio = result["variants"]["full"]["ratios"]["paired"]["ratio"]
    assert math.isfinite(ratio) and ratio > 0
    assert result["agent_records"] >= 1


def test_the_stand_in_is_counted_as_the_model_it_stands_in_for():
    spec = bench.flops_spec(bench.make_model("stand-in", "cpu"))
    assert spec == bench.flops_spec()
