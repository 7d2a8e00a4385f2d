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


ROOT = Path(__file__).resolve().parents[1]
# The product's folders and their import names (pyproject's package-dir).
PRODUCT = {
    "packscope": "packscope",
    "agent": "packscope.agent",
    "trainer": "packscope.trainer",
    "backend": "packscope.backend",
    "frontend": "packscope.frontend",
    "alembic": "packscope.migrations",
    "gallery": "packscope.gallery",
}


def module_name(path: Path) -> str:
    folder, *rest = path.relative_to(ROOT).with_suffix("").parts
    parts = [PRODUCT[folder], *rest]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path) -> set[str]:
    """Every module `path` imports, as written in its source (imports inside functions and the
    "module:function" references the `packscope` command loads by name included), an absolute
    `from a import b` as both `a` and `a.b`."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
        elif isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            found |= set(re.findall(r"^(packscope(?:\.\w+)+):\w+$", node.value))
    return found


def product_modules(folder: str) -> list[Path]:
    return sorted(p for p in (ROOT / folder).rglob("*.py") if "__pycache__" not in p.parts)


def ours(modules: set[str]) -> set[str]:
    return {m for m in modules if m == "packscope" or m.startswith("packscope.")}


def is_under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


# -- packscope/: the core below everything, the commands above everything (docs/architecture.md) ---
def test_the_core_imports_the_standard_library_and_itself_alone():
    wrong = {
        f"{module_name(path)} imports {target}"
        for path in product_modules("packscope/core")
        for target in imports_of(path)
        if not is_under(target, "packscope.core") and target.split(".")[0] not in sys.stdlib_module_names
    }
    assert not wrong, sorted(wrong)


def test_nothing_below_the_commands_imports_them():
    wrong = {
        f"{module_name(path)} imports {target}"
        for folder in PRODUCT
        for path in product_modules(folder)
        if not is_under(module_name(path), "packscope.commands") and path != ROOT / "packscope" / "__main__.py"
        for target in imports_of(path)
        if is_under(target, "packscope.commands")
    }
    assert not wrong, sorted(wrong)


def test_the_package_face_is_the_version_and_the_entry_point():
    """packscope/__init__.py imports nothing of ours; `python -m packscope` is the commands' cli."""
    assert not ours(imports_of(ROOT / "packscope" / "__init__.py"))
    assert ours(imports_of(ROOT / "packscope" / "__main__.py")) == {
        "packscope.commands.cli",
        "packscope.commands.cli.main",
    }


def test_every_module_of_packscope_imports_the_standard_library_alone():
    """The base distribution has no dependencies (pyproject), and the `packscope` command is in it:
    importing any module of packscope/ (the core, the commands, the face) loads nothing else, so
    that each command imports what it runs only once chosen (serve the backend, train torch) and
    `import`, `sync`, `export` and `flops` run with the bare package."""
    names = [module_name(p) for p in product_modules("packscope") if p.name != "__main__.py"]
    loaded = imported_after("; ".join(f"import {name}" for name in names)) - imported_after("pass")
    libraries = {m for m in loaded if not is_under(m, "packscope") and m.split(".")[0] not in sys.stdlib_module_names}
    below = {m for m in ours(loaded) - {"packscope"} if not m.startswith(("packscope.core", "packscope.commands"))}
    assert not libraries and not below, sorted(libraries | below)


# -- the other product folders: what each may import of ours (docs/architecture.md) -------------------
# The agent lives in users' training processes: the core alone. The trainer is the agent's first
# user. The migrations are frozen history: they name tables, never the live models or the catalogue
# (issue 19); alembic's env.py alone reads the server's settings and models, to connect and compare.
# The gallery and the frontend are data a command or the server reads.
MAY_IMPORT = {
    "agent": ("packscope.core", "packscope.agent"),
    "trainer": ("packscope.core", "packscope.agent", "packscope.trainer"),
    "alembic/versions": (),
    "gallery": (),
    "frontend": (),
}


@pytest.mark.parametrize("folder", MAY_IMPORT)
def test_each_product_folder_imports_only_what_its_layer_may(folder):
    wrong = {
        f"{module_name(path)} imports {target}"
        for path in product_modules(folder)
        for target in ours(imports_of(path))
        if not any(is_under(target, allowed) for allowed in MAY_IMPORT[folder])
    }
    assert not wrong, sorted(wrong)


# -- the server and the agent -----------------------------------------------------------------------
def test_the_server_side_never_imports_torch():
    assert "torch" not in imported_after("import packscope.backend.server.app, packscope.backend.server.serving")


def test_the_server_side_imports_nothing_from_the_agent():
    modules = imported_after("import packscope.backend.server.app, packscope.backend.server.serving")
    assert not {m for m in modules if m.startswith(("packscope.agent", "packscope.trainer"))}


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
    "alerts": ("formulas", "api", "store", "reads"),
    "http": ("formulas", "api", "store", "ingest", "reads", "alerts"),
    "routes": ("formulas", "api", "store", "ingest", "reads", "alerts", "http"),
    "server": ("formulas", "api", "store", "ingest", "reads", "alerts", "http", "routes"),
}
BACKEND = ROOT / "backend"


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
    loose = {p.name for p in BACKEND.glob("*.py")} - {"__init__.py"}
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
