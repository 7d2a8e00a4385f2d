"""The HF callback, the calculator and the Python API on the same omni micro-batches: the callback's
record, `packscope flops --audio` and ModelSpec's own FLOPs, each view, to the integer."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from packscope.core.audio_sums import AUDIO_RECORD_SUMS
from packscope.core.flops import ModelSpec, packs_breakdown_by_kind

VIEWS = ("bshd", "thd", "useful")
ROW = 16  # tokens of each micro-batch's one row: one document, as `--pack 16` counts it


def callback_record(model: ModelSpec, batches: list[dict[str, Any]]) -> dict[str, Any]:
    """The record of one step whose micro-batches are `batches` (each a row of ROW tokens with its
    clips), as the HF callback observes them, the heavy inputs kept as their shapes as its hook does."""
    from packscope.agent import Agent, AgentConfig
    from packscope.agent.integrations.batches import shapes_of_heavy
    from packscope.agent.integrations.hf import PackscopeCallback

    callback = PackscopeCallback(check_cross_documents=False)
    agent = Agent(AgentConfig(log_every=1, count_syncs=False), model=model)
    agent.step_begin()
    for clips in batches:
        batch = shapes_of_heavy({"input_ids": torch.zeros(1, ROW, dtype=torch.long), **clips})
        callback._observe_batch(agent, (), batch)
    agent.step_end()
    agent.close()
    (record,) = agent.records
    return record


def cli_report(config: dict[str, Any], calls: list[list[int]], tmp_path: Path, capsys: Any) -> dict[str, Any]:
    """`packscope flops --hf-config … --pack ROW (one a micro-batch) --audio …` as JSON."""
    from packscope.commands.cli import main

    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    args = ["flops", "--hf-config", str(path), "--pack-length", str(ROW)]
    for clips in calls:  # a micro-batch without clips: its row alone
        args += ["--pack", str(ROW), *(["--audio", ",".join(map(str, clips))] if clips else [])]
    assert main(args) == 0
    return json.loads(capsys.readouterr().out)


def api_flops(model: ModelSpec, calls: list[list[int]]) -> dict[str, int]:
    """The Python API: the decoder's packs and ModelSpec.audio's FLOPs of the same calls."""
    assert model.audio is not None
    decoder = packs_breakdown_by_kind(model, [[ROW]] * len(calls), ROW)
    tower = model.audio.flops(model.audio.batch_sums(calls))
    return {view: getattr(decoder, f"flops_{view}") + tower for view in VIEWS}


def check_all_three_agree(
    model: ModelSpec, config: dict[str, Any], inputs: list[dict[str, Any]], calls: list[list[int]], tmp_path, capsys
) -> dict[str, Any]:
    """The record's FLOPs, the CLI's and the API's, equal in every view; the record's audio sums the
    CLI's. Returns the record."""
    record = callback_record(model, inputs)
    cli = cli_report(config, calls, tmp_path, capsys)
    api = api_flops(model, calls)
    assert cli["audio"]["in_totals"] is True
    assert {name: record[name] for name in cli["audio"]["sums"]} == cli["audio"]["sums"]
    assert all(record[name] == 0 for name in AUDIO_RECORD_SUMS if name not in cli["audio"]["sums"])
    for view in VIEWS:
        # floats on the wire; below 2^53 they hold the integer exactly
        assert cli[f"flops_{view}"] < 2**53
        assert record[f"flops_{view}"] == float(cli[f"flops_{view}"]) == float(api[view]), view
    return record
