"""The distribution: torch-free base, extras without upper pins, a wheel that carries its data
files and builds without setuptools warnings, and (slow) the install proofs of check_install.sh."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def requirement_name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower()


def expand_extra(extra: str, seen: frozenset[str] = frozenset()) -> list[str]:
    """An extra's requirements, with packscope[...] self-references followed."""
    out: list[str] = []
    for req in PROJECT["optional-dependencies"][extra]:
        if requirement_name(req) == "packscope":
            for inner in re.search(r"\[(.*)\]", req).group(1).split(","):  # type: ignore[union-attr]
                if inner.strip() not in seen:
                    out += expand_extra(inner.strip(), seen | {extra})
        else:
            out.append(req)
    return out


def test_the_base_distribution_is_torch_free():
    assert not [r for r in PROJECT["dependencies"] if requirement_name(r) == "torch"]


def test_the_server_extra_pulls_no_torch():
    assert "torch" not in {requirement_name(r) for r in expand_extra("server")}


@pytest.mark.parametrize("extra", ["agent", "trainer"])
def test_the_agent_side_extras_declare_torch_with_a_floor(extra):
    torch_reqs = [r for r in expand_extra(extra) if requirement_name(r) == "torch"]
    assert torch_reqs and all(">=" in r for r in torch_reqs)


def test_no_upper_pin_on_torch_anywhere():
    reqs = list(PROJECT["dependencies"])
    for extra in PROJECT["optional-dependencies"]:
        reqs += PROJECT["optional-dependencies"][extra]
    for req in reqs:
        if requirement_name(req) == "torch":
            assert not re.search(r"<|==|~=", req), req


def source_copy(dest: Path) -> Path:
    """Tracked and new unignored files, so a build writes nothing into the checkout."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split("\0")
    for name in filter(None, listed):
        src = ROOT / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)
    return dest


# A run file added to the copy's gallery/, so that the wheel is seen to carry the gallery's data
# files before the checkout holds any (the real ones are checked with the folders below).
GALLERY_PROBE = "packaging-probe.jsonl"


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory) -> tuple[Path, str]:
    src = source_copy(tmp_path_factory.mktemp("src"))
    (src / "gallery" / GALLERY_PROBE).write_text('{"run": {"run_id": "probe"}}\n')
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", str(src), "-w", str(out), "--no-deps", "--no-build-isolation", "-v"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = out.glob("packscope-*.whl")
    return wheel, proc.stdout + proc.stderr


@pytest.mark.slow
def test_the_wheel_builds_without_setuptools_warnings(built_wheel):
    _, log = built_wheel
    # "byte-compiling is disabled" follows PYTHONDONTWRITEBYTECODE in the environment, not the project.
    warnings = [
        line
        for line in log.splitlines()
        if re.search(r"warn", line, re.IGNORECASE)
        and "byte-compiling is disabled" not in line
        and "is ignored: it is neither a file nor a directory" not in line  # pip's index settings here
    ]
    assert not warnings, "\n".join(warnings)


@pytest.mark.slow
def test_the_wheel_carries_every_module_and_data_file(built_wheel):
    wheel, _ = built_wheel
    names = set(zipfile.ZipFile(wheel).namelist())
    setuptools_cfg = PYPROJECT["tool"]["setuptools"]
    expected = set()
    for package, folder in setuptools_cfg["package-dir"].items():
        base = ROOT / folder
        for path in base.rglob("*"):
            rel = path.relative_to(base)
            if "__pycache__" in rel.parts or not path.is_file():
                continue
            # Sub-folders that are packages of their own are listed under their own mapping.
            if path.suffix == ".py" or path.suffix in {".js", ".css", ".html", ".mako", ".jsonl"}:
                expected.add("/".join([*package.split("."), *rel.parts]))
    missing = sorted(expected - names)
    assert not missing, missing
    for data in (
        "packscope/frontend/templates/base.html",
        "packscope/frontend/static/app.css",
        "packscope/migrations/script.py.mako",
        "packscope/gallery/__init__.py",
        f"packscope/gallery/{GALLERY_PROBE}",
    ):
        assert data in names
    metadata = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    assert "License-Expression: Apache-2.0" in metadata
    assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names)
    torch_lines = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: torch")]
    assert torch_lines and all("extra ==" in line for line in torch_lines), torch_lines


@pytest.mark.slow
def test_install_proofs(tmp_path):
    """check_install.sh with the torch of this environment: (a) it stays put, (b) the server runs without torch."""
    try:
        import importlib.metadata

        torch_version = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:
        torch_version = None
    env = dict(os.environ, PYTHON=sys.executable)
    if torch_version:
        env["PACKSCOPE_CHECK_TORCH"] = torch_version
    else:
        env["PACKSCOPE_CHECK_ONLY"] = "b"
    proc = subprocess.run(
        ["bash", str(ROOT / "tests" / "packaging" / "check_install.sh"), str(tmp_path)],
        capture_output=True,
        text=True,
        env=env,
        timeout=1500,
    )
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-6000:]
    assert "check_install: ok" in proc.stdout
