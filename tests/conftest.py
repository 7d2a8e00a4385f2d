"""What every test shares, so that tests can run side by side (`make test` runs them on several
pytest-xdist workers) and beside other checkouts' test runs on the same machine."""

import pytest

pytest_plugins = ["pytester"]  # tests/test_isolation.py runs make test's worker options on a module of its own


@pytest.fixture(autouse=True)
def _private_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """A home directory of the test's own (beside its tmp_path, which some tests list). The agent
    spools under ~/.cache/packscope/spool when it is given no spool_dir (the reference trainer gives
    none), and the subprocesses that tests start inherit HOME: without this, parallel tests would
    share one spool folder, and leave files in the real home."""
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))
