"""`make test` runs the suite on several pytest-xdist workers at once, and other checkouts may run
theirs on the same machine: no test may write where another one does (tests/conftest.py)."""

import os
import re
from pathlib import Path

TESTS = Path(__file__).resolve().parent
# A fixed name in the machine's temporary folder: a literal /tmp/name, or a name joined onto $TMPDIR.
FIXED_TMP_PATH = re.compile(r"""["']/tmp/\w|\(["']TMPDIR["']""")


def test_each_test_has_a_home_of_its_own(tmp_path):
    # The agent's default spool folder (~/.cache/packscope/spool) expands under it, in this
    # process and in every subprocess a test starts.
    assert Path(os.environ["HOME"]) == tmp_path / "home"
    assert Path("~/.cache").expanduser() == tmp_path / "home" / ".cache"


def test_no_test_writes_to_a_fixed_path_under_tmp():
    found = [
        f"{path.relative_to(TESTS)}:{number}: {line.strip()}"
        for path in sorted(TESTS.rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if FIXED_TMP_PATH.search(line)
    ]
    assert found == [], "use tmp_path (one folder per test) or tempfile's unique names"
