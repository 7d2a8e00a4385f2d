"""One chromium per test module, for every browser test."""

import os
from pathlib import Path

import pytest
from browser_support import CHROMIUM, CHROMIUM_ARGS
from playwright import sync_api


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        message = f"{CHROMIUM} is missing: apt-get install -y chromium (make test does, as root)"
        if os.environ.get("CI"):
            pytest.fail(message)  # CI installs it: a missing browser there is a broken set-up
        pytest.skip(message)
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def context(browser):
    """One context per module: its HTTP cache keeps the 4.5 MB plotly bundle between tests.
    Modules that need other options (downloads, a time zone) define their own."""
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    yield context
    context.close()


@pytest.fixture
def page(context):
    """A tab of the module's `context` that fails its test on any console error or page error.
    Modules whose pages log errors on purpose define their own."""
    page = context.new_page()
    page.errors = []
    page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    yield page
    assert page.errors == []
    page.close()
