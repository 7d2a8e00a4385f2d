"""Fixtures for the command tests: run files from a real (tiny, CPU) training, and a real server."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cli.support import running_server, train


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Run files of two tiny CPU runs on the same documents: {"thd": path, "bshd": path}."""
    root = tmp_path_factory.mktemp("trained")
    return {layout: train(root / layout, layout, f"cli-test-{layout}") for layout in ("thd", "bshd")}


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("server") / "packscope.db") as base:
        yield base
