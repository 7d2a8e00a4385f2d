"""The plotly.js bundle the server serves (frontend/vendor/plotly.min.js) is the one that
frontend/plotly_bundle.mjs builds from the `plotly.js` package that package-lock.json pins:
committed, so that `make demo` needs no npm, and checked here against the pin (and, where `npm ci`
has installed the package and esbuild, rebuilt and compared byte for byte)."""

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from packscope.frontend import PLOTLY_JS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "node_modules" / "plotly.js"
BUILD = ROOT / "frontend" / "plotly_bundle.mjs"


def pinned(name: str) -> str:
    lock = json.loads((ROOT / "package-lock.json").read_text())
    version = lock["packages"][f"node_modules/{name}"]["version"]
    assert json.loads((ROOT / "package.json").read_text())["devDependencies"][name] == version
    return version


def test_the_committed_bundle_is_of_the_pinned_release():
    # The trace types in the banner are the build script's own list (rebuilt and compared below).
    banner = re.match(rb"/\*\*\n\* plotly\.js \([\w, ]+ - minified\) v([\d.]+)\n", PLOTLY_JS.read_bytes())
    assert banner, "not the bundle frontend/plotly_bundle.mjs builds"
    assert banner.group(1).decode() == pinned("plotly.js")
    assert "MIT License" in (PLOTLY_JS.parent / "plotly-LICENSE").read_text()


def test_the_committed_bundle_is_the_pinned_package_built_again_byte_for_byte(tmp_path):
    if not (PACKAGE / "package.json").exists() or not (ROOT / "node_modules" / "esbuild").exists():
        message = f"{PACKAGE} or esbuild is missing: npm ci installs them"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI runs npm ci first
        pytest.skip(message)
    assert json.loads((PACKAGE / "package.json").read_text())["version"] == pinned("plotly.js")
    assert (PACKAGE / "LICENSE").read_bytes() == (PLOTLY_JS.parent / "plotly-LICENSE").read_bytes()
    built = tmp_path / "plotly.min.js"
    subprocess.run(["node", str(BUILD), str(built)], cwd=ROOT, check=True, timeout=120)
    assert built.read_bytes() == PLOTLY_JS.read_bytes(), "make vendor-plotly builds it again"
