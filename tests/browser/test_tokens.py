"""A server started with both tokens, in Debian's chromium: the dashboard asks for the read token
(sign-in form), then an edit asks for the ingest token on its first 401 and keeps it for the tab."""

import httpx
import pytest
from browser_support import run_body, running_server, until
from wire_records import packed_interval

pytestmark = pytest.mark.browser

READ, INGEST = "read-secret", "ingest-secret"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    env = {"PACKSCOPE_READ_TOKEN": READ, "PACKSCOPE_INGEST_TOKEN": INGEST}
    with running_server(tmp_path_factory.mktemp("tokens") / "tokens.db", **env) as base:
        write = {"Authorization": f"Bearer {INGEST}"}
        assert (
            httpx.post(f"{base}/api/v1/runs", json=run_body("locked", "locked run"), headers=write).status_code == 201
        )
        body = {"intervals": [packed_interval(k, loss=3.0) for k in range(3)]}
        assert httpx.post(f"{base}/api/v1/runs/locked/intervals", json=body, headers=write).status_code == 200
        yield base


@pytest.fixture
def page(browser):
    context = browser.new_context(viewport={"width": 1300, "height": 900})
    page = context.new_page()
    page.errors = []
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    yield page
    context.close()


def stored_name(base):
    answer = httpx.get(f"{base}/api/v1/runs/locked", headers={"Authorization": f"Bearer {READ}"})
    return answer.json()["name"]


def sign_in(page, token):
    page.fill("input[name=token]", token)
    page.click("form.sign-in button")


def test_read_token_then_ingest_token_on_the_first_401(server, page):
    page.goto(f"{server}/runs/locked?x=elapsed")
    assert "This dashboard is closed" in page.inner_text("h1")
    sign_in(page, "wrong")
    until(page, "document.querySelector('[role=alert]')?.textContent.includes('does not match')")
    sign_in(page, READ)
    until(page, "location.pathname === '/runs/locked' && location.search === '?x=elapsed'")  # the view asked for
    # The cookie opens the API too: the charts draw.
    until(page, "(document.querySelector('#chart-loss .plot')?.data || []).length === 1")

    page.goto(server)
    until(page, "document.querySelector('tr[data-run-id=\"locked\"]') !== null")
    page.get_by_label("rename locked").click()
    field = page.get_by_label("new name of locked")
    field.fill("renamed")
    field.press("Enter")
    until(page, "document.getElementById('token-dialog').open")  # the PATCH answered 401
    page.fill("#token-input", "not-it")
    page.click("#token-ok")
    until(page, "document.querySelector('#token-dialog .dialog-error')?.textContent.includes('refused')")
    assert stored_name(server) == "locked run"
    page.fill("#token-input", INGEST)
    page.click("#token-ok")
    until(page, "document.querySelector('tr[data-run-id=\"locked\"] .run-title a')?.textContent === 'renamed'")
    assert stored_name(server) == "renamed"

    # Kept for the tab: the next edit asks nothing.
    page.get_by_label("actions of locked").click()  # the row's menu
    page.get_by_label("archive locked").click()
    until(page, "document.querySelector('tr[data-run-id=\"locked\"]') === null")
    assert not page.evaluate("document.getElementById('token-dialog').open")
    answer = httpx.get(f"{server}/api/v1/runs/locked", headers={"Authorization": f"Bearer {READ}"})
    assert answer.json()["archived"] is True
    assert not page.errors


def test_cancelling_the_token_prompt_saves_nothing(server, page):
    page.goto(f"{server}/?archived=true")  # the first test archived the run
    sign_in(page, READ)
    until(page, "document.querySelector('tr[data-run-id=\"locked\"]') !== null")
    before = stored_name(server)
    page.get_by_label("actions of locked").click()  # the row's menu
    page.get_by_label("edit tags and notes of locked").click()
    page.fill("#edit-notes", "never saved")
    page.click("#edit-save")
    until(page, "document.getElementById('token-dialog').open")
    page.evaluate("() => { document.getElementById('refreshed').textContent = ''; }")
    page.locator("#token-dialog").get_by_role("button", name="Cancel").click()
    # The table refreshes after every edit; the refusal must outlive that refresh.
    until(page, "document.getElementById('refreshed').textContent !== ''")
    assert "needs the ingest token" in page.inner_text("#error")
    answer = httpx.get(f"{server}/api/v1/runs/locked", headers={"Authorization": f"Bearer {READ}"}).json()
    assert answer["notes"] == "" and answer["name"] == before
    assert not page.errors
