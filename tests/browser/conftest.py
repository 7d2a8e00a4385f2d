"""One chromium per test module, for every browser test."""

import pytest
from browser_support import CHROMIUM, CHROMIUM_ARGS, require_chromium
from playwright import sync_api


@pytest.fixture(scope="module")
def browser():
    require_chromium()
    with sync_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def context(browser):
    """One context per module: its HTTP cache keeps the 1.2 MB plotly bundle between tests.
    Modules that need other options (downloads, a time zone) define their own."""
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    yield context
    context.close()


def _collect_errors(page, allow: tuple[str, ...] = ()) -> None:
    """Keep the page's console and page errors in `page.errors`; `allow`: substrings of errors the
    test causes on purpose (a missing run's 404)."""
    page.errors = []
    page.allowed_errors = allow
    page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    page.on("pageerror", lambda e: page.errors.append(str(e)))


def _unexpected_errors(page) -> list[str]:
    return [e for e in page.errors if not any(a in e for a in page.allowed_errors)]


@pytest.fixture
def sized_page(browser):
    """`open(width, height=900, allow=())`: a new page of that viewport, failing its test at the
    end on any console or page error but those containing one of `allow`."""
    pages = []

    def open_at(width: int, height: int = 900, allow: tuple[str, ...] = ()):
        page = browser.new_page(viewport={"width": width, "height": height})
        _collect_errors(page, allow)
        pages.append(page)
        return page

    yield open_at
    for page in pages:
        assert _unexpected_errors(page) == []
        page.close()


@pytest.fixture
def page(context):
    """A tab of the module's `context` that fails its test on any console error or page error.
    Modules whose pages log errors on purpose define their own."""
    page = context.new_page()
    _collect_errors(page)
    yield page
    assert _unexpected_errors(page) == []
    page.close()
