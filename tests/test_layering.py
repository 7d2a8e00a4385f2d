"""The architecture's import rules (docs/architecture.md), checked in fresh interpreters."""

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest


def imported_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return set(out.split())


@pytest.mark.parametrize(
    "statement",
    [
        "import packscope.backend.server.app",
        "import packscope.backend.cli",
    ],
)
def test_the_server_side_never_imports_torch(statement):
    assert "torch" not in imported_after(statement)


def test_the_server_side_imports_nothing_from_the_agent():
    modules = imported_after("import packscope.backend.server.app, packscope.backend.cli")
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


# The backend's layers (docs/architecture.md), lowest first: the layers each may import besides
# its own. The write path (ingest) and the read path (reads) never import each other.
BACKEND_LAYERS = {
    "formulas": (),
    "api": (),
    "store": ("formulas",),
    "ingest": ("formulas", "api", "store"),
    "reads": ("formulas", "api", "store"),
    "http": ("formulas", "api", "store", "ingest", "reads"),
    "routes": ("formulas", "api", "store", "ingest", "reads", "http"),
    "server": ("formulas", "api", "store", "ingest", "reads", "http", "routes"),
}
BACKEND = Path(__file__).resolve().parents[1] / "backend"
# Another branch moves backend/cli.py into the commands package; until that merge it stays here.
LEAVING_THE_BACKEND = {"cli.py"}


def _backend_imports(path: Path) -> set[str]:
    """Every packscope.backend module that `path` imports, by the name after packscope.backend
    ("store.models"; "contact" for `from packscope.backend import contact`), imports inside
    functions included."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module:
            targets = [f"{node.module}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        else:
            continue
        for target in targets:
            parts = target.split(".")
            if parts[:2] == ["packscope", "backend"] and len(parts) > 2:
                found.add(".".join(parts[2:4]))
    return found


def test_every_backend_module_is_in_a_layer():
    loose = {p.name for p in BACKEND.glob("*.py")} - {"__init__.py"} - LEAVING_THE_BACKEND
    folders = {p.name for p in BACKEND.iterdir() if p.is_dir() and p.name != "__pycache__"}
    assert not loose, f"backend modules outside every layer folder: {sorted(loose)}"
    assert folders <= set(BACKEND_LAYERS), f"folders of no layer: {sorted(folders - set(BACKEND_LAYERS))}"


@pytest.mark.parametrize("layer", BACKEND_LAYERS)
def test_a_backend_layer_imports_only_the_layers_below_it(layer):
    allowed = {layer, *BACKEND_LAYERS[layer]}
    wrong = {
        f"{layer}/{path.name} imports {target}"
        for path in sorted((BACKEND / layer).glob("*.py"))
        for target in _backend_imports(path)
        if target.split(".")[0] not in allowed
    }
    assert not wrong, sorted(wrong)


def test_the_architecture_draws_the_backend_as_it_is():
    """docs/architecture.md's backend row names each layer folder (**`store/`**), in this order,
    and every module of it in its part: a move of the code must update the doc."""
    doc = (BACKEND.parent / "docs" / "architecture.md").read_text()
    row = next(line for line in doc.splitlines() if line.startswith("| `backend/`"))
    assert re.findall(r"\*\*`(\w+)/`\*\*", row) == list(BACKEND_LAYERS)
    parts = dict(re.findall(r"\*\*`(\w+)/`\*\*([^*]*)", row))
    missing = {
        f"{layer}/{path.name}"
        for layer in BACKEND_LAYERS
        for path in (BACKEND / layer).glob("*.py")
        if path.name != "__init__.py" and f"`{path.name}`" not in parts[layer]
    }
    assert not missing, f"modules the doc's backend row does not name in their layer: {sorted(missing)}"
