"""The architecture's import rules (docs/architecture.md), checked in fresh interpreters."""

import ast
import re
import subprocess
import sys
from pathlib import Path


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


# -- the server and the agent -----------------------------------------------------------------------
def test_the_server_side_never_imports_torch():
    assert "torch" not in imported_after("import packscope.backend.app, packscope.backend.serving")


def test_the_server_side_imports_nothing_from_the_agent():
    modules = imported_after("import packscope.backend.app, packscope.backend.serving")
    assert not {m for m in modules if m.startswith(("packscope.agent", "packscope.trainer"))}


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
