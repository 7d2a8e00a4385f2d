"""The README's promises that code can check: its two set-up commands are the ones the Makefile
and CI run, and every `packscope` command it lists exists."""

from __future__ import annotations

import re
from pathlib import Path

from packscope.cli import COMMANDS

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _two_commands() -> list[str]:
    section = README.split("## Two commands", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.S)
    assert block, "README: no bash block under 'Two commands'"
    return [line.split("#", 1)[0].strip() for line in block.group(1).splitlines() if line.strip()]


def test_the_two_commands_are_the_makefiles_and_ci_runs_the_test_one():
    demo, test = _two_commands()
    assert (demo, test) == ("make demo", "make test")
    targets = re.findall(r"^([a-z-]+):", (ROOT / "Makefile").read_text(), re.M)
    assert {"demo", "test"} <= set(targets)
    ci = [line.strip() for line in (ROOT / ".ci/run").read_text().splitlines() if line.strip()]
    assert ci[-1] == test, "CI must end with the README's test command"


def test_every_listed_packscope_command_exists():
    listed = set(re.findall(r"`packscope ([a-z]+)", README))
    assert listed, "README lists no packscope command"
    assert listed <= set(COMMANDS), sorted(listed - set(COMMANDS))
