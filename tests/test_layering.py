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
        "import packscope.commands.serve",
    ],
)
def test_the_server_side_never_imports_torch(statement):
    assert "torch" not in imported_after(statement)


def test_the_server_side_imports_nothing_from_the_agent():
    modules = imported_after("import packscope.backend.app, packscope.commands.serve")
    assert not {m for m in modules if m.startswith(("packscope.agent", "packscope.trainer"))}


SERVER_LIBRARIES = ("fastapi", "starlette", "sqlalchemy", "pydantic", "alembic", "uvicorn", "plotly", "jinja2")


def test_the_core_imports_neither_torch_nor_the_server_libraries():
    core = ("flops", "histograms", "catalogue", "hf_config")
    modules = imported_after("import packscope.commands.flops, " + ", ".join(f"packscope.core.{m}" for m in core))
    assert not {m for m in modules if m.split(".")[0] in ("torch", "numpy", *SERVER_LIBRARIES)}
    assert not {m for m in modules if m.startswith(("packscope.agent", "packscope.backend", "packscope.trainer"))}


def test_the_importer_needs_neither_torch_nor_the_server_nor_the_agent():
    """`packscope import` runs with the bare package, [agent] or [server] (docs/gallery.md)."""
    modules = imported_after("import packscope.commands.importer, packscope.gallery, packscope.commands.cli")
    assert not {m for m in modules if m.split(".")[0] in ("torch", "numpy", "httpx", *SERVER_LIBRARIES)}
    assert not {m for m in modules if m.startswith(("packscope.agent", "packscope.backend", "packscope.trainer"))}


def test_the_agent_imports_nothing_from_the_server_side():
    modules = imported_after("import packscope.agent.agent, packscope.agent.cupti, packscope.agent.nvml")
    assert not {m for m in modules if m.startswith(("packscope.backend", "fastapi", "sqlalchemy", "pydantic"))}


BACKEND_LAYERS = ("store", "ingest", "reads", "routes")  # lowest first (docs/architecture.md)


def _upward_imports() -> set[tuple[str, str]]:
    """(importer, imported) for every import in a backend layer of a module in a higher layer,
    as paths under backend/, from the source (imports inside functions included)."""
    import ast
    from pathlib import Path

    backend = Path(__file__).resolve().parents[1] / "backend"
    found = set()
    for rank, layer in enumerate(BACKEND_LAYERS):
        for path in sorted((backend / layer).glob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.module:
                    targets = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
                elif isinstance(node, ast.Import):
                    targets = [alias.name for alias in node.names]
                else:
                    continue
                for target in targets:
                    parts = target.split(".")
                    if parts[:2] != ["packscope", "backend"] or len(parts) < 4 or parts[2] not in BACKEND_LAYERS:
                        continue
                    module = backend / parts[2] / f"{parts[3]}.py"
                    if BACKEND_LAYERS.index(parts[2]) > rank and module.exists():
                        found.add((f"{layer}/{path.name}", f"{parts[2]}/{parts[3]}.py"))
    return found


def test_the_architecture_names_every_backend_import_that_goes_up_a_layer():
    """docs/architecture.md says the backend's layers import only those below them and names each
    import that does not (a move of the code must update the doc, and the doc may not invent one)."""
    import re
    from pathlib import Path

    doc = (Path(__file__).resolve().parents[1] / "docs" / "architecture.md").read_text()
    layer = "(?:" + "|".join(BACKEND_LAYERS) + r")/\w+\.py"
    named = set(re.findall(rf"`({layer})` imports `({layer})`", doc))
    assert named == _upward_imports()
