"""`packscope flops` on bad inputs: one line that says what is wrong and exit 2, never argparse's
usage block; a Hub id for --hf-config is told how to fetch config.json (no network); a padded
vocabulary is said on one line beside the JSON."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from packscope.commands.cli import main

LLAMA = Path(__file__).parent.parent / "fixtures" / "hf" / "llama3_8b.json"


def run(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        code = main(["flops", *args])
    except SystemExit as exc:  # argparse's exit
        code = exc.code if isinstance(exc.code, int) else 1
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize(
    "pack,message",
    [
        ("a,b", "a pack is comma-separated whole numbers of tokens (e.g. 4096,2048), got 'a,b'"),
        ("", "a pack needs at least one document length (e.g. 4096,2048), got ''"),
        ("1e3", "a pack is comma-separated whole numbers of tokens (e.g. 4096,2048), got '1e3'"),
        ("10000000000000000000", "a pack holds at most 2147483647 tokens"),
        ("2000000000,2000000000", "a pack holds at most 2147483647 tokens"),  # each fits, the pack does not
    ],
)
def test_a_bad_pack_is_one_line_exit_2(capsys, pack, message):
    code, out, err = run(capsys, "--hf-config", str(LLAMA), "--pack", pack)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("packscope flops: error: argument --pack: ")
    assert message in err and "usage:" not in err


def test_the_largest_pack_is_accepted(capsys):
    code, out, _ = run(capsys, "--hf-config", str(LLAMA), "--pack", str(2**31 - 1))
    assert code == 0 and json.loads(out)["seqlen_sq_sum_thd"] == (2**31 - 1) ** 2


@pytest.mark.parametrize(
    "args,message",
    [
        (["--pack", "10", "--pack-length", "x"], "a pack length is a whole number of tokens, got 'x'"),
        (["--pack", "10", "--pack-length", str(2**31)], "a pack length is 1..2147483647 tokens"),
        (["--pack", "10", "--tp", "two"], "--tp is a whole number of GPUs, got 'two'"),
    ],
)
def test_other_bad_numbers_are_one_line_too(capsys, args, message):
    code, _, err = run(capsys, "--hf-config", str(LLAMA), *args)
    assert code == 2 and err.count("\n") == 1 and message in err and "usage:" not in err


def test_a_missing_option_is_one_line(capsys):
    code, _, err = run(capsys, "--pack", "10")
    assert code == 2 and err.count("\n") == 1 and "--hf-config" in err and "usage:" not in err


def test_a_hub_id_is_told_how_to_fetch_its_config(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # no folder of that name here
    code, out, err = run(capsys, "--hf-config", "Qwen/Qwen3-8B", "--pack", "10")
    assert code == 2 and out == "" and err.count("\n") == 1
    assert "`hf download Qwen/Qwen3-8B config.json --local-dir Qwen3-8B`" in err
    assert "huggingface-cli download" in err
    assert "https://huggingface.co/Qwen/Qwen3-8B/resolve/main/config.json" in err


def test_a_local_folder_named_like_a_hub_id_is_read(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "meta-llama" / "Llama-3-8B").mkdir(parents=True)
    (tmp_path / "meta-llama" / "Llama-3-8B" / "config.json").write_text(LLAMA.read_text())
    code, out, _ = run(capsys, "--hf-config", "meta-llama/Llama-3-8B", "--pack", "10")
    assert code == 0 and json.loads(out)["tokens"] == 10


def test_a_missing_file_that_is_no_hub_id_says_so(capsys, tmp_path):
    code, _, err = run(capsys, "--hf-config", str(tmp_path / "nowhere" / "config.json"), "--pack", "10")
    assert code == 2 and "no config file at" in err and "hf download" not in err


def test_tp_padding_the_vocabulary_is_said_on_one_line(capsys):
    code, out, err = run(capsys, "--hf-config", str(LLAMA), "--pack", "10", "--tp", "8")
    assert code == 0
    # Megatron's padding, computed here: the divisor for V = 128256 read from a config.json is the
    # largest power of two <= 128 dividing V (128), times TP.
    vocab, step = 128256, 128 * 8
    padded = math.ceil(vocab / step) * step
    assert json.loads(out)["padded_vocab"] == padded == 129024
    assert err == (
        f"packscope flops: note: the logits count a vocabulary of {padded}, not {vocab} (+{padded - vocab}): "
        f"padded Megatron-style to a multiple of {step} (divisor 128 x --tp 8)\n"
    )


def test_no_notice_when_nothing_is_padded(capsys):
    code, out, err = run(capsys, "--hf-config", str(LLAMA), "--pack", "10")
    assert code == 0 and err == "" and json.loads(out)["padded_vocab"] == 128256
