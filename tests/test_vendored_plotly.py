"""The plotly.js bundle the server serves (frontend/vendor/plotly-cartesian.min.js) is the one
package-lock.json pins: committed, so that `make demo` needs no npm, and checked here against
the pin (and, where `npm ci` has installed it, byte for byte against the package)."""

import json
import os
import re
from pathlib import Path

import pytest

from packscope.frontend import PLOTLY_JS

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "plotly.js-cartesian-dist-min"
INSTALLED = ROOT / "node_modules" / PACKAGE / "plotly-cartesian.min.js"


def pinned() -> str:
    lock = json.loads((ROOT / "package-lock.json").read_text())
    version = lock["packages"][f"node_modules/{PACKAGE}"]["version"]
    assert json.loads((ROOT / "package.json").read_text())["devDependencies"][PACKAGE] == version
    return version


def test_the_committed_bundle_is_the_pinned_release():
    banner = re.match(rb"/\*\*\n\* plotly\.js \(cartesian - minified\) v([\d.]+)\n", PLOTLY_JS.read_bytes())
    assert banner, "not plotly.js's cartesian bundle"
    assert banner.group(1).decode() == pinned()
    assert "MIT License" in (PLOTLY_JS.parent / "plotly-LICENSE").read_text()


def test_the_committed_bundle_is_the_installed_package_byte_for_byte():
    if not INSTALLED.exists():
        message = f"{INSTALLED} is missing: npm ci installs it"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI runs npm ci first
        pytest.skip(message)
    assert json.loads((INSTALLED.parent / "package.json").read_text())["version"] == pinned()
    assert INSTALLED.read_bytes() == PLOTLY_JS.read_bytes(), "make vendor-plotly copies it again"
