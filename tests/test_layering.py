"""The architecture's import rules (docs/architecture.md), checked in fresh interpreters."""

import subprocess
import sys

import pytest


def imported_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


@pytest.mark.parametrize(
    "statement",
    [
        "import packscope.backend.app",
        "import packscope.backend.cli",
    ],
)
def test_the_server_side_never_imports_torch(statement):
    assert "torch" not in imported_after(statement)


def test_the_server_side_imports_nothing_from_the_agent():
    modules = imported_after("import packscope.backend.app, packscope.backend.cli")
    assert not {m for m in modules if m.startswith(("packscope.agent", "packscope.trainer"))}


SERVER_LIBRARIES = ("fastapi", "starlette", "sqlalchemy", "pydantic", "alembic", "uvicorn", "plotly", "jinja2")


def test_the_core_imports_neither_torch_nor_the_server_libraries():
    core = ("flops", "histograms", "catalogue", "hf_config")
    modules = imported_after("import packscope.flops_cmd, " + ", ".join(f"packscope.core.{m}" for m in core))
    assert not {m for m in modules if m.split(".")[0] in ("torch", "numpy", *SERVER_LIBRARIES)}
    assert not {m for m in modules if m.startswith(("packscope.agent", "packscope.backend", "packscope.trainer"))}


def test_the_importer_needs_neither_torch_nor_the_server_nor_the_agent():
    """`packscope import` runs with the bare package, [agent] or [server] (docs/gallery.md)."""
    modules = imported_after("import packscope.importer, packscope.gallery, packscope.cli")
    assert not {m for m in modules if m.split(".")[0] in ("torch", "numpy", "httpx", *SERVER_LIBRARIES)}
    assert not {m for m in modules if m.startswith(("packscope.agent", "packscope.backend", "packscope.trainer"))}


def test_the_agent_imports_nothing_from_the_server_side():
    modules = imported_after("import packscope.agent.agent, packscope.agent.cupti, packscope.agent.nvml")
    assert not {m for m in modules if m.startswith(("packscope.backend", "fastapi", "sqlalchemy", "pydantic"))}
