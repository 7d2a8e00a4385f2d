"""The dashboard in Debian's chromium against a real server: charts, values, live SSE updates."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.browser
sync_api = pytest.importorskip("playwright.sync_api")

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
MODEL = {"layers": 4, "hidden": 512, "heads": 8, "ffn": 2048, "vocab": 32000}
STEPS = 10
PACK = 4096
LINES = "document.querySelector('#chart-tflops .plot').data.filter(t => t.meta.kind === 'line')"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def interval(k, gpu_time_s):
    # Eight documents of 512 per pack: the dense baseline counts 8x the attention of THD.
    tokens = STEPS * PACK
    hist = {"count": [0] * 24, "tokens": [0] * 24}
    hist["count"][9], hist["tokens"][9] = 8 * STEPS, tokens
    packs = {"count": [0] * 24, "tokens": [0] * 24}
    packs["count"][12], packs["tokens"][12] = STEPS, tokens
    return {
        "interval": k, "rank": 0, "first_step": k * STEPS + 1, "last_step": (k + 1) * STEPS,
        "steps": STEPS, "gpus": 1, "wall_start": 1000.0 + k, "wall_end": 1000.0 + k + gpu_time_s,
        "gpu_time_s": gpu_time_s, "host_time_s": gpu_time_s, "step_time_p50_s": gpu_time_s / STEPS,
        "step_time_p90_s": gpu_time_s / STEPS, "step_time_max_s": gpu_time_s / STEPS, "timing_lag_steps": 0,
        "tokens": tokens, "real_tokens": tokens - 256, "packs": STEPS, "documents": 8 * STEPS,
        "seqlen_sq_sum_bshd": STEPS * PACK**2, "seqlen_sq_sum_thd": STEPS * 8 * 512**2,
        "flops_bshd": 1e12, "flops_thd": 5e11, "flops_useful": 4e11,
        "syncs": {"total": 3 * STEPS, "sites": [{"site": "train.py:88", "count": 3 * STEPS}]},
        "histograms": {"documents": hist, "packs": packs},
        "loss": 5.0 - 0.1 * k,
    }


def post_intervals(base, run_id, ks, slowdown=1.0):
    body = {"intervals": [interval(k, slowdown * (0.5 + 0.05 * (k % 3))) for k in ks]}
    answer = httpx.post(f"{base}/api/v1/runs/{run_id}/intervals", json=body)
    assert answer.status_code == 200, answer.text


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = tmp_path_factory.mktemp("dashboard") / "dashboard.db"
    port = free_port()
    env = {**os.environ, "PACKSCOPE_DATABASE_URL": f"sqlite:///{db}", "PACKSCOPE_STREAM_POLL_S": "0.2"}
    process = subprocess.Popen(
        [sys.executable, "-m", "uvicorn", "--factory", "packscope.backend.app:create_app",
         "--host", "127.0.0.1", "--port", str(port), "--log-level", "warning"],
        env=env, cwd=db.parent,  # not the checkout: its alembic/ folder would shadow the alembic package
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{base}/api/v1/runs").raise_for_status()
                break
            except httpx.HTTPError:
                assert process.poll() is None, "the server exited while starting"
                assert time.monotonic() < deadline, "the server did not answer within 30 s"
                time.sleep(0.1)
        for run_id, name in [("live-run", "thd-live"), ("other-run", "thd-other")]:
            body = {"run_id": run_id, "name": name, "project": "browser", "model": MODEL, "layout": "thd",
                    "hardware": {"gpu_name": "NVIDIA H200", "gpu_count": 1, "peak_tflops": 989.0}}
            assert httpx.post(f"{base}/api/v1/runs", json=body).status_code == 201
        post_intervals(base, "live-run", range(12))
        post_intervals(base, "other-run", range(6), slowdown=1.25)
        yield base
    finally:
        process.terminate()
        process.wait(timeout=10)


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


@pytest.fixture
def page(browser):
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.errors = []
    page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    yield page
    page.close()


def last_values(base, run_id):
    columns = httpx.get(f"{base}/api/v1/runs/{run_id}/series").json()["columns"]
    return {"baseline": columns["tflops_bshd"][-1], "THD-corrected": columns["tflops_thd"][-1],
            "useful": columns["tflops_useful"][-1]}


def plotted(page):
    return {t["name"]: (len(t["y"]), t["y"][-1]) for t in page.evaluate(f"{LINES}.map(t => ({{name: t.name, y: t.y}}))")}


def test_run_page_draws_and_extends_live(server, page):
    page.goto(f"{server}/runs/live-run")
    page.wait_for_function(f"document.querySelector('#chart-tflops .plot').data && {LINES}.length === 3")
    expected = last_values(server, "live-run")
    lines = plotted(page)
    assert sorted(lines) == sorted(expected)
    for name, value in expected.items():
        assert lines[name] == (12, pytest.approx(value, rel=1e-9))
    assert expected["baseline"] > expected["THD-corrected"] > expected["useful"]
    assert page.inner_text("[data-stat=tflops_thd] .value") != "—"
    assert "3.00" in page.inner_text("#sync-sites-body")
    labels = page.evaluate("document.querySelector('#chart-histogram .plot').data[0].x")
    assert "512–1023" in labels and "4096–8191" in labels

    # New intervals arrive through SSE and extend the traces; the page does not reload.
    page.evaluate("window.notReloaded = true")
    page.wait_for_selector("#live.on")
    post_intervals(server, "live-run", range(12, 15))
    page.wait_for_function(f"{LINES}.every(t => t.y.length === 15)", timeout=10_000)
    assert page.evaluate("window.notReloaded === true")
    expected = last_values(server, "live-run")
    for name, (count, value) in plotted(page).items():
        assert count == 15 and value == pytest.approx(expected[name], rel=1e-9)
    page.wait_for_function("document.querySelector('[data-stat=steps] .value').textContent === '150'")

    page.screenshot(path="/tmp/run_page.png", full_page=True)
    assert page.errors == []


def test_chart_csv_holds_what_was_plotted(server, page):
    page.goto(f"{server}/runs/live-run")
    page.wait_for_function(f"document.querySelector('#chart-tflops .plot').data && {LINES}.length === 3")
    with page.expect_download() as download:
        page.click("#chart-tflops .csv-link")
    assert download.value.suggested_filename == "live-run-tflops.csv"
    header, *rows = Path(download.value.path()).read_text().splitlines()
    assert header.startswith("step,tflops_useful,tflops_bshd,tflops_thd,tflops_useful_max,")
    columns = httpx.get(f"{server}/api/v1/runs/live-run/series").json()["columns"]
    assert [int(row.split(",")[0]) for row in rows] == columns["step"]
    assert [float(row.split(",")[3]) for row in rows] == pytest.approx(columns["tflops_thd"], rel=1e-12)


def test_runs_page_lists_runs_and_compares(server, page):
    page.goto(server + "/")
    page.wait_for_selector("tr[data-run-id=live-run]")
    assert "thd-other" in page.inner_text("#runs-body")
    page.check("tr[data-run-id=live-run] input")
    page.check("tr[data-run-id=other-run] input")
    page.screenshot(path="/tmp/runs_page.png", full_page=True)
    page.click("#compare")
    page.wait_for_url("**/compare?run_id=live-run&run_id=other-run")
    page.wait_for_function("document.querySelector('#chart-tflops .plot').data?.length === 4")
    table = page.inner_text("#compare-table")
    assert "thd-live" in table and "thd-other" in table and "Over-count" in table
    assert "+25.0 %" in table  # the other run's step time, relative to the first
    test = httpx.get(f"{server}/api/v1/compare", params=[("run_id", "live-run"), ("run_id", "other-run")]).json()
    (verdict,) = test["step_time_tests"]
    assert "Step time vs first run" in table and "Useful TFLOP/s/GPU" in table
    assert f"last {verdict['n']} vs {verdict['n_baseline']} intervals" in table
    assert ("different" if verdict["p_value"] < 0.01 else "no clear difference") in table
    dashes = page.evaluate("document.querySelector('#chart-tflops .plot').data.map(t => t.line.dash)")
    assert dashes == ["solid", "dash", "solid", "dash"]
    page.screenshot(path="/tmp/compare_page.png", full_page=True)
    assert page.errors == []


def test_empty_run_draws_its_first_interval_live(server, page):
    body = {"run_id": "empty-run", "name": "waiting", "model": MODEL, "layout": "bshd"}
    assert httpx.post(f"{server}/api/v1/runs", json=body).status_code == 201
    page.goto(f"{server}/runs/empty-run")
    page.wait_for_selector("#chart-tflops.is-empty")
    assert "Waiting for the first interval" in page.inner_text("#chart-tflops")
    assert "peak TFLOP/s" in page.inner_text("#chart-mfu")

    page.wait_for_selector("#live.on")
    post_intervals(server, "empty-run", range(2))
    page.wait_for_selector("#chart-tflops:not(.is-empty)", timeout=10_000)
    page.wait_for_function(f"{LINES}.every(t => t.y.length === 2)")
    page.wait_for_selector("#chart-histogram:not(.is-empty)")
    assert "peak TFLOP/s" in page.inner_text("#chart-mfu")  # still no peak, still explained
    assert page.errors == []
