"""The alerts on the pages (docs/alerts.md), in Debian's chromium against a real server at 1280x800:
the run page's banner names each open alert and its history lists every one; the runs list's badge
marks the alerting run and its filter keeps only such runs; nothing scrolls sideways."""

import time

import httpx
import pytest
from browser_support import run_body, running_server, until
from wire_records import packed_interval

pytestmark = pytest.mark.browser

STRAGGLER = "a-run-whose-rank-3-straggles-on-a-host-with-a-long-name-20261206"


def wait_for_alerts(client: httpx.Client, count: int, state: str = "all") -> None:
    deadline = time.monotonic() + 15
    while len(client.get(f"/api/v1/alerts?state={state}").json()) != count:  # judged off the requests
        assert time.monotonic() < deadline, f"never {count} {state} alerts"
        time.sleep(0.05)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with (
        running_server(tmp_path_factory.mktemp("alerts") / "alerts.db") as base,
        httpx.Client(base_url=base) as client,
    ):
        hosts = [f"gpu-node-{r:02d}.cluster.example.org" for r in range(4)]
        body = run_body(STRAGGLER, "straggler", config={"hosts": hosts}, parallel={"dp": 4})
        assert client.post("/api/v1/runs", json=body).status_code == 201
        records = []
        for k in range(10):
            for rank in range(4):
                r = packed_interval(k, gpu_time_s=0.9 if rank == 3 and k >= 6 else 0.5, loss=2.0)
                r["rank"] = rank
                records.append(r)
        assert client.post(f"/api/v1/runs/{STRAGGLER}/intervals", json={"intervals": records}).status_code == 200
        for run_id in ("failed-run", "quiet-run"):
            assert client.post("/api/v1/runs", json=run_body(run_id)).status_code == 201
        assert client.patch("/api/v1/runs/failed-run", json={"status": "failed"}).status_code == 200
        assert client.patch("/api/v1/runs/quiet-run", json={"status": "finished"}).status_code == 200
        # Opened, then resolved: history only.
        assert client.patch("/api/v1/runs/quiet-run", json={"status": "failed"}).status_code == 200
        wait_for_alerts(client, 3)
        assert client.patch("/api/v1/runs/quiet-run", json={"status": "finished"}).status_code == 200
        wait_for_alerts(client, 2, "open")
        yield base


def no_sideways_scroll(page) -> None:
    width, client = page.evaluate(
        "() => [document.scrollingElement.scrollWidth, document.scrollingElement.clientWidth]"
    )
    assert width <= client


def test_the_run_page_shows_the_open_alert_and_the_history(server, sized_page):
    page = sized_page(1280, 800)
    page.goto(f"{server}/runs/{STRAGGLER}")
    banner = page.locator("#alerts-banner")
    assert banner.is_visible()
    assert banner.locator("#alerts-count").inner_text() == "1 open alert"
    (item,) = banner.locator("li").all()
    text = item.inner_text()
    assert "straggler" in text and "rank 3" in text and "gpu-node-03.cluster.example.org" in text
    assert "ledger term: stragglers" in text
    assert page.locator("#alerts-history-body tr").count() == 1
    assert banner.bounding_box()["y"] < 800  # seen without scrolling
    no_sideways_scroll(page)


def test_a_resolved_alert_is_history_only(server, sized_page):
    page = sized_page(1280, 800)
    page.goto(f"{server}/runs/quiet-run")
    assert not page.locator("#alerts-banner").is_visible()
    page.locator("#alerts-history summary").click()
    row = page.locator("#alerts-history-body tr").inner_text()
    assert "crashed" in row and "open" not in row.split("\t")[3]


def test_the_runs_list_badges_alerting_runs_and_filters_them(server, sized_page):
    page = sized_page(1280, 800)
    page.goto(server)
    until(page, "document.querySelectorAll('#runs-body tr[data-run-id]').length === 3")
    badges = {
        run_id: page.locator(f"tr[data-run-id='{run_id}'] .badge.alerting").all_inner_texts()
        for run_id in (STRAGGLER, "failed-run", "quiet-run")
    }
    assert badges == {STRAGGLER: ["⚠ 1 alert"], "failed-run": ["⚠ 1 alert"], "quiet-run": []}
    assert page.locator(f"tr[data-run-id='{STRAGGLER}'] .badge.alerting").get_attribute("title") == "straggler (rank 3)"
    no_sideways_scroll(page)
    page.locator("#filter-alerts").check()
    until(page, "document.querySelectorAll('#runs-body tr[data-run-id]').length === 2")
    assert "alerts=open" in page.url
    shown = page.eval_on_selector_all("#runs-body tr[data-run-id]", "rows => rows.map(r => r.dataset.runId)")
    assert sorted(shown) == sorted([STRAGGLER, "failed-run"])
