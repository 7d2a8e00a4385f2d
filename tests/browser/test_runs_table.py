"""The runs table in Debian's chromium against a real server: sort, filter, search, rename, tag,
delete behind a confirmation."""

import time
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from browser_support import run_body, running_server, until
from wire_records import packed_interval

pytestmark = pytest.mark.browser

RUNS = [  # run_id, name, project, layout, tags, intervals (throughput falls with the slowdown)
    ("fast-run", "fast one", "alpha", "thd", ["h200"], 1.0),
    ("slow-run", "slow one", "alpha", "bshd", ["base"], 2.0),
    ("mid-run", "middle", "beta", "thd", ["base"], 1.5),
]
ROWS = "[...document.querySelectorAll('#runs-body tr[data-run-id]')].map(r => r.dataset.runId).join(',')"


def post_intervals(base, run_id, count, slowdown):
    body = {"intervals": [packed_interval(k, gpu_time_s=slowdown * 0.5, loss=3.0) for k in range(count)]}
    assert httpx.post(f"{base}/api/v1/runs/{run_id}/intervals", json=body).status_code == 200


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("runs-table") / "runs.db") as base:
        for i, (run_id, name, project, layout, tags, slowdown) in enumerate(RUNS):
            body = run_body(
                run_id, name, project=project, tags=tags, layout=layout, started_at=f"2026-11-29T0{i}:00:00Z"
            )
            assert httpx.post(f"{base}/api/v1/runs", json=body).status_code == 201
            post_intervals(base, run_id, 3, slowdown)
        yield base


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    yield page
    context.close()


def query(page):
    return parse_qs(urlparse(page.url).query)


def rows(page, expected):
    until(page, f"{ROWS} === {expected!r}")


def test_sort_toggles_on_header_click(server, page):
    page.goto(server)
    rows(page, "mid-run,slow-run,fast-run")  # newest first
    head = page.locator("th[data-metric='tflops_useful']")
    head.locator("button.sort").click()
    rows(page, "fast-run,mid-run,slow-run")  # numbers: highest first
    assert head.get_attribute("aria-sort") == "descending"
    head.locator("button.sort").click()
    rows(page, "slow-run,mid-run,fast-run")
    assert head.get_attribute("aria-sort") == "ascending"
    page.locator("th[data-sort='name'] button.sort").click()
    rows(page, "fast-run,mid-run,slow-run")  # text: A to Z
    assert "sort=name" in page.url
    assert not page.errors


def menu(page, select):
    return page.evaluate(f"[...document.querySelectorAll('{select} option')].map(o => [o.value, o.textContent])")


def test_filters_and_search(server, page):
    page.goto(server)
    rows(page, "mid-run,slow-run,fast-run")
    until(page, "document.getElementById('run-count').textContent === '3 runs'")
    # The menus list what the runs carry, with their counts (GET /api/v1/facets).
    until(page, "document.querySelectorAll('#filter-tag option').length === 3")
    assert menu(page, "#filter-project") == [["", "any"], ["alpha", "alpha (2)"], ["beta", "beta (1)"]]
    assert menu(page, "#filter-tag") == [["", "any"], ["base", "base (2)"], ["h200", "h200 (1)"]]
    page.select_option("#filter-layout", "thd")
    rows(page, "mid-run,fast-run")
    page.select_option("#filter-tag", "base")
    rows(page, "mid-run")
    until(page, "document.getElementById('run-count').textContent === '1 run'")
    assert query(page)["tag"] == ["base"]
    page.reload()  # the URL keeps the menus' choice
    rows(page, "mid-run")
    until(page, "document.querySelectorAll('#filter-tag option').length === 3")
    assert page.input_value("#filter-tag") == "base"
    page.select_option("#filter-layout", "")
    page.select_option("#filter-tag", "")
    page.select_option("#filter-project", "alpha")
    rows(page, "slow-run,fast-run")
    page.select_option("#filter-project", "")
    page.fill("#filter-q", "SLOW")  # debounced search over name, run id and tags
    rows(page, "slow-run")
    page.fill("#filter-q", "nothing-like-this")
    until(page, "document.getElementById('runs-body').textContent.includes('No runs match')")
    assert not page.errors


def test_menus_follow_tag_edits(server, page):
    page.goto(server)
    until(page, "document.querySelectorAll('#filter-tag option').length === 3")
    assert httpx.patch(f"{server}/api/v1/runs/fast-run", json={"tags": ["h200", "sweep-9"]}).status_code == 200
    until(page, "[...document.querySelectorAll('#filter-tag option')].some(o => o.value === 'sweep-9')", timeout=15_000)
    assert ["sweep-9", "sweep-9 (1)"] in menu(page, "#filter-tag")
    assert httpx.patch(f"{server}/api/v1/runs/fast-run", json={"tags": ["h200"]}).status_code == 200
    assert not page.errors


def test_rename_and_tags(server, page):
    page.goto(server)
    rows(page, "mid-run,slow-run,fast-run")
    page.get_by_label("rename mid-run").click()
    field = page.get_by_label("new name of mid-run")
    field.fill("renamed middle")
    field.press("Enter")
    until(page, "document.querySelector('tr[data-run-id=\"mid-run\"] .run-title a')?.textContent === 'renamed middle'")
    assert httpx.get(f"{server}/api/v1/runs/mid-run").json()["name"] == "renamed middle"

    page.get_by_label("actions of mid-run").click()  # the row's menu
    page.get_by_label("edit tags and notes of mid-run").click()
    page.fill("#edit-tags", "base, sweep-7")
    page.fill("#edit-notes", "lr 3e-4, best so far")
    page.click("#edit-save")
    tags = "[...document.querySelectorAll('tr[data-run-id=\"mid-run\"] .tag')].map(t => t.textContent).join()"
    until(page, f"{tags} === 'base,sweep-7'")
    run = httpx.get(f"{server}/api/v1/runs/mid-run").json()
    assert (run["tags"], run["notes"]) == (["base", "sweep-7"], "lr 3e-4, best so far")
    assert not page.errors


def test_delete_needs_confirmation(server, page):
    page.goto(server)
    until(page, "document.querySelector('tr[data-run-id=\"slow-run\"]') !== null")
    page.get_by_label("actions of slow-run").click()  # the row's menu
    page.get_by_label("delete slow-run").click()
    dialog = page.locator("#delete-dialog")
    until(page, "document.getElementById('delete-dialog').open")
    assert "slow one" in dialog.inner_text() and "slow-run" in dialog.inner_text()
    dialog.get_by_role("button", name="Cancel").click()
    until(page, "!document.getElementById('delete-dialog').open")
    time.sleep(0.3)
    assert httpx.get(f"{server}/api/v1/runs/slow-run").status_code == 200
    assert page.locator("tr[data-run-id='slow-run']").count() == 1

    page.get_by_label("actions of slow-run").click()  # the row's menu
    page.get_by_label("delete slow-run").click()
    page.click("#delete-confirm")
    until(page, "document.querySelector('tr[data-run-id=\"slow-run\"]') === null")
    assert httpx.get(f"{server}/api/v1/runs/slow-run").status_code == 404
    assert not page.errors
