"""Run mypy over the import names the distribution installs (packscope.agent, ...), not the folders.

The folders map to import names through [tool.setuptools.package-dir] (agent/ -> packscope.agent,
alembic/ -> packscope.migrations, ...), which mypy cannot follow: setuptools' editable install is
an import hook, and checked from the checkout root, `import alembic` would find alembic/. So this
lays the mapping out as a tree of symlinks under build/typecheck/, runs mypy from inside it, and
prints each finding with the real file's path. Arguments are passed on to mypy.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "build" / "typecheck"
EXTRA = ["bench"]  # plain scripts, checked as top-level modules


def package_dirs() -> dict[str, str]:
    """Import name -> folder, for every package whose folder differs from its name."""
    setuptools_cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    return dict(setuptools_cfg.get("package-dir", {}))


def build_tree() -> dict[str, str]:
    """Lay out the tree; returns tree-relative prefix -> checkout-relative prefix, longest first."""
    shutil.rmtree(TREE, ignore_errors=True)
    TREE.mkdir(parents=True)
    mapping: dict[str, str] = {}
    dirs = package_dirs()
    # Sub-packages mapped to their own folders are links; everything else in a mapped
    # package's folder is linked entry by entry, so new files need no change here.
    for name in sorted(dirs, key=lambda n: n.count(".")):
        target = TREE.joinpath(*name.split("."))
        source = ROOT / dirs[name]
        depth = name.count(".") + 1
        mapped_children = {n.rsplit(".", 1)[1] for n in dirs if n.startswith(name + ".") and n.count(".") == depth}
        if target.exists() or target.is_symlink():
            continue
        if mapped_children:
            target.mkdir(parents=True)
            for entry in source.iterdir():
                if entry.name not in mapped_children and entry.name != "__pycache__":
                    (target / entry.name).symlink_to(entry)
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.symlink_to(source, target_is_directory=True)
        mapping[str(target.relative_to(TREE)) + os.sep] = dirs[name].rstrip("/") + os.sep
    for folder in EXTRA:
        (TREE / folder).symlink_to(ROOT / folder, target_is_directory=True)
    return dict(sorted(mapping.items(), key=lambda kv: -len(kv[0])))


def main(argv: list[str]) -> int:
    mapping = build_tree()
    top = sorted({n.split(".")[0] for n in package_dirs()})
    scripts = [str(p.relative_to(TREE)) for folder in EXTRA for p in sorted((TREE / folder).glob("*.py"))]
    cmd = [
        sys.executable,
        "-m",
        "mypy",
        "--config-file",
        str(ROOT / "pyproject.toml"),
        "--cache-dir",
        str(ROOT / ".mypy_cache"),
        *argv,
    ]
    cmd += top + scripts  # as files: mypy takes either packages (-p) or files, not both
    proc = subprocess.run(cmd, cwd=TREE, capture_output=True, text=True)
    pattern = re.compile("^(" + "|".join(re.escape(k) for k in mapping) + ")")
    for line in (proc.stdout + proc.stderr).splitlines():
        print(pattern.sub(lambda m: mapping[m.group(1)], line))
    return proc.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
