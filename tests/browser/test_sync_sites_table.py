"""The run page's sync-sites table in Debian's chromium against a real server: a site is the
agent's "path:line in function"; a long one (up to the 500 characters the server stores) shows its
tail, where the file, the line and the function are, with the whole site in its title."""

import httpx
import pytest
from browser_support import run_body, running_server, until
from wire_records import packed_interval

from packscope.core.catalogue import MAX_SITE_LENGTH

pytestmark = pytest.mark.browser
SHORT = "trainer/legacy_logging.py:43 in LegacyLogging.loss_accumulator"
LONG = "…" + ("/a_rather_long_directory_name" * 20 + "/utils.py:7 in Loader.next")[-(MAX_SITE_LENGTH - 1) :]
CELLS = "rows => rows.map(r => [r.cells[0].textContent, r.cells[0].querySelector('code').title])"


def interval(k: int) -> dict:
    record = packed_interval(k, syncs_per_step=2)
    record["syncs"]["sites"] = [{"site": LONG, "count": 15}, {"site": SHORT, "count": 5}]  # 20 syncs, the long first
    return record


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("sites") / "sites.db") as base:
        assert httpx.post(f"{base}/api/v1/runs", json=run_body("sites-run", "sites")).status_code == 201
        body = {"intervals": [interval(k) for k in range(2)]}
        assert httpx.post(f"{base}/api/v1/runs/sites-run/intervals", json=body).status_code == 200
        yield base


def test_a_long_site_shows_its_tail_and_the_whole_in_its_title(server, page):
    assert len(LONG) == MAX_SITE_LENGTH  # as long as the server stores
    page.goto(f"{server}/runs/sites-run")
    until(page, "document.querySelectorAll('#sync-sites-body code').length === 2")
    (long_text, long_title), (short_text, short_title) = page.eval_on_selector_all("#sync-sites-body tr", CELLS)
    assert long_title == LONG and long_text.startswith("…") and LONG.endswith(long_text[1:])
    assert long_text.endswith("/utils.py:7 in Loader.next") and len(long_text) < 100
    assert short_text == short_title == SHORT
