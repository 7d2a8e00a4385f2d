"""`make test` runs the suite on several pytest-xdist workers at once, and other checkouts may run
theirs on the same machine: no test may write where another one does (tests/conftest.py)."""

import os
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# A fixed name in the machine's temporary folder: a literal /tmp/name, or a name joined onto $TMPDIR.
FIXED_TMP_PATH = re.compile(r"""["']/tmp/\w|\(["']TMPDIR["']""")


def test_each_test_has_a_home_of_its_own(tmp_path_factory):
    # The agent's default spool folder (~/.cache/packscope/spool) expands under it, in this
    # process and in every subprocess a test starts.
    home = Path("~").expanduser()
    assert home == Path(os.environ["HOME"]) and home.is_relative_to(tmp_path_factory.getbasetemp())
    assert list(home.iterdir()) == []  # a fresh one


def test_no_test_writes_to_a_fixed_path_under_tmp():
    found = [
        f"{path.relative_to(TESTS)}:{number}: {line.strip()}"
        for path in sorted(TESTS.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if FIXED_TMP_PATH.search(line)
    ]
    assert found == [], "use tmp_path (one folder per test) or tempfile's unique names"


SHARING = """
import os
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def server():
    return "one per module"


@pytest.mark.parametrize("n", range(8))
def test_sharing(server, n):
    Path(os.environ["RAN_ON"], f"sharing-{n}").write_text(os.environ["PYTEST_XDIST_WORKER"])


@pytest.mark.parametrize("n", range(8))
def test_alone(n):
    pass
"""


def test_make_tests_workers_run_the_tests_that_share_a_module_fixture_on_one(pytester, tmp_path, monkeypatch):
    # A module-scoped server split across workers would be started on each, and what one test
    # leaves in it would be missing for the next test on another worker.
    workers = re.search(r"^XDIST\s*:=\s*-n \S+ (.*)$", (TESTS.parent / "Makefile").read_text(), re.M)
    assert workers, "the Makefile names no XDIST options"
    pytester.makepyfile(test_sharing=SHARING)
    ran_on = tmp_path / "ran_on"
    ran_on.mkdir()
    monkeypatch.setenv("RAN_ON", str(ran_on))
    result = pytester.runpytest_subprocess("-p", "xdist", "-n", "2", *workers.group(1).split())
    result.assert_outcomes(passed=16)
    assert len({path.read_text() for path in ran_on.iterdir()}) == 1
