"""`packscope train`'s options, generated from TrainConfig: one per field, parsed back into the same
config, the flags of before kept, clear errors for bad values, and no torch to build the parser."""

from __future__ import annotations

import argparse
import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from packscope.commands.cli import main
from packscope.trainer.config import DataConfig, TrainConfig, add_train_arguments, config_from_args
from packscope.trainer.faults import fault_text

# Every field away from its default, so that the round trip below proves each one is mapped.
EVERY_FIELD_CHANGED = TrainConfig(
    preset="1b",
    layout="bshd",
    steps=7,
    pack_length=1024,
    packs_per_step=8,
    micro_batches=2,
    max_docs_per_pack=5,
    align=8,
    static=True,
    lr=0.01,
    warmup_steps=3,
    weight_decay=0.05,
    grad_clip=0.5,
    seed=4,
    device="cpu",
    dtype="float16",
    compile=True,
    chunked_ce=True,
    fused_projections=True,
    window=128,
    count_window_as_full=True,
    cuda_graphs=True,
    legacy_logging=True,
    loader_delay_ms=2.5,
    channel_loss=True,
    legacy_channel_loss=True,
    parallel="ddp",
    sync_backend="cupti",
    count_syncs_every=3,
    records_dir="records",
    log_every=5,
    peak_tflops=0.5,
    progress=False,
    server="http://x:1",
    name="n",
    project="p",
    run_id="run-1",
    start_step=6,
    faults=("slowdown:from=3,factor=2,until=5", "nan-loss:at=4", "crash:at=6"),
    data=DataConfig(min_len=4, short_share=0.5, short_median=32, long_median=256, sigma=0.5, rules=4),
)

# The options `packscope train` had before they were generated (README, docs, scripts use them).
FLAGS_OF_BEFORE = (
    "--layout",
    "--preset",
    "--steps",
    "--pack-length",
    "--packs-per-step",
    "--micro-batches",
    "--max-docs-per-pack",
    "--align",
    "--static",
    "--lr",
    "--seed",
    "--device",
    "--dtype",
    "--compile",
    "--log-every",
    "--server",
    "--name",
    "--project",
    "--no-progress",
)


def train_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="packscope train")
    add_train_arguments(parser)
    return parser


def leaves(config: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(option dest, value) of every field, a nested config's fields prefixed with its name."""
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            yield from leaves(value, f"{prefix}{f.name}_")
        else:
            yield prefix + f.name, value


def argv_for(config: TrainConfig) -> list[str]:
    argv = []
    for dest, value in leaves(config):
        flag = dest.replace("_", "-")
        if isinstance(value, bool):
            argv.append(f"--{flag}" if value else f"--no-{flag}")
        elif dest == "faults":  # the repeatable --fault
            for fault in value:
                argv += ["--fault", fault_text(fault)]
        else:
            argv += [f"--{flag}", str(value)]
    return argv


def test_every_field_has_an_option_and_the_flags_of_before_remain():
    parser = train_parser()
    dests = {a.dest for a in parser._actions if a.dest != "help"}
    assert dests == {dest for dest, _ in leaves(TrainConfig())}
    assert set(FLAGS_OF_BEFORE) <= set(parser._option_string_actions)


def test_options_parse_back_into_the_config():
    defaults = dict(leaves(TrainConfig()))
    unchanged = [dest for dest, value in leaves(EVERY_FIELD_CHANGED) if value == defaults[dest]]
    assert not unchanged, f"give {unchanged} a value other than the default in EVERY_FIELD_CHANGED"
    assert config_from_args(train_parser().parse_args(argv_for(EVERY_FIELD_CHANGED))) == EVERY_FIELD_CHANGED
    assert config_from_args(train_parser().parse_args([])) == TrainConfig()


def test_help_shows_the_fields_help_and_defaults():
    text = " ".join(train_parser().format_help().split())
    assert "--pack-length INT token slots per pack; no document is longer (default: 512)" in text
    assert "--no-progress turn off the progress bar" in text
    assert "--lr FLOAT peak learning rate (default: the preset's)" in text
    assert "--data-sigma FLOAT log-normal spread of both modes (default: 0.8)" in text


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--steps", "many"], "argument --steps: invalid int value: 'many'"),
        (["--layout", "sbhd"], "argument --layout: invalid choice: 'sbhd'"),
        (["--preset", "7b"], "argument --preset: invalid choice: '7b'"),
        (["--lr", "fast"], "argument --lr: invalid float value: 'fast'"),
        (
            ["--packs-per-step", "3", "--micro-batches", "2"],
            "packscope train: error: packs_per_step (3) must be a multiple of micro_batches (2)",
        ),
        (["--steps", "10", "--start-step", "10", "--run-id", "r"], "error: start_step (10) must be below steps (10)"),
        (
            ["--start-step", "3"],
            "packscope train: error: start_step (3) continues an existing run: give its run_id too",
        ),
        (["--data-short-share", "1.5"], "packscope train: error: data.short_share must be between 0 and 1, got 1.5"),
        (["--steps", "0"], "packscope train: error: steps must be >= 1, got 0"),
        (
            ["--server", "localhost:8000"],
            "packscope train: error: the packscope server must be a URL like http://127.0.0.1:8000 (http or https), "
            "got 'localhost:8000'; did you mean http://localhost:8000?",
        ),
        (["--server", "http://"], "got 'http://': it names no host"),
    ],
)
def test_a_bad_value_is_explained_with_exit_code_2(argv, message, capsys):
    try:
        code = main(["train", *argv])
    except SystemExit as exit:  # argparse's own errors
        code = exit.code
    assert code == 2
    err = capsys.readouterr().err
    assert message in err and "packscope train: error:" in err


def test_the_train_command_parses_without_torch():
    # torch set to None in sys.modules makes any `import torch` fail.
    code = "import sys; sys.modules['torch'] = None; from packscope.commands.cli import main; main(['train', '--help'])"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--run-id" in proc.stdout and "--data-sigma" in proc.stdout
