"""The README's promises that code can check: its two set-up commands are the ones the Makefile
and CI run, and every `packscope` command it lists exists."""

from __future__ import annotations

import re
from pathlib import Path

from packscope.commands.cli import COMMANDS

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


def _gpu_only_examples() -> list[Path]:
    """The examples that refuse to start without CUDA (a plain `python` run on a CPU exits)."""
    refusal = re.compile(r"if not torch\.cuda\.is_available\(\):\s*\n\s*raise SystemExit")
    return [p for p in sorted((ROOT / "examples").glob("*.py")) if refusal.search(p.read_text())]


def test_an_example_that_needs_a_gpu_says_so_where_it_is_listed():
    examples_readme = (ROOT / "examples" / "README.md").read_text()
    gpu_only = _gpu_only_examples()
    assert gpu_only, "no example refuses a CPU: drop this test's premise or its search"
    for example in gpu_only:
        (row,) = [line for line in examples_readme.splitlines() if line.startswith(f"| `{example.name}`")]
        assert "GPU" in row, f"examples/README.md's row of {example.name} does not say it needs a GPU"
        for module in set(re.findall(r"packscope\.agent\.integrations\.(\w+)", example.read_text())):
            # The README's bullet of that integration: from its "- **" to the next one.
            bullets = [b for b in re.split(r"\n- \*\*", README) if f"packscope.agent.integrations.{module}." in b]
            assert bullets and all("GPU" in b for b in bullets), (
                f"README: the {module} bullet does not say it needs a GPU"
            )
