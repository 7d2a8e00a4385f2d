"""The chart controls (x axis, log y, EMA smoothing) and the compare overlay in Debian's chromium:
what they draw, and that the URL carries them through a reload."""

import csv
import io
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from browser_support import run_body, running_server, until
from wire_records import packed_interval

pytestmark = pytest.mark.browser

STEPS = 10
PACK = 4096


def traces(chart, kind):
    return f"(document.querySelector('#{chart} .plot')?.data || []).filter(t => t.meta.kind === '{kind}')"


def interval(k, slowdown):
    gpu_time_s = slowdown * (0.5 + 0.05 * (k % 3))
    pack = PACK * (1 + k % 2)  # uneven, so tokens seen is not a multiple of the step
    loss = 5.0 - 0.2 * k + 0.3 * (k % 3)  # noisy, so smoothing changes it
    return packed_interval(k, steps=STEPS, pack=pack, gpu_time_s=gpu_time_s, loss=loss)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("controls") / "controls.db") as base:
        for run_id, count, slowdown in [("alpha", 12, 1.0), ("beta", 8, 1.25)]:
            assert httpx.post(f"{base}/api/v1/runs", json=run_body(run_id)).status_code == 201
            body = {"intervals": [interval(k, slowdown) for k in range(count)]}
            assert httpx.post(f"{base}/api/v1/runs/{run_id}/intervals", json=body).status_code == 200
            assert httpx.patch(f"{base}/api/v1/runs/{run_id}", json={"status": "finished"}).status_code == 200
        yield base


@pytest.fixture(scope="module")
def context(browser):
    context = browser.new_context(viewport={"width": 1300, "height": 900}, accept_downloads=True)
    yield context
    context.close()


def series(base, run_id):
    return httpx.get(f"{base}/api/v1/runs/{run_id}/series").json()["columns"]


def ema(values, weight):
    """Debiased EMA (TensorBoard's, W&B's classic smoothing)."""
    last, out = 0.0, []
    for seen, value in enumerate(values, start=1):
        last = last * weight + (1 - weight) * value
        out.append(last / (1 - weight**seen))
    return out


def query(page):
    return parse_qs(urlparse(page.url).query)


def test_log_scale_sets_the_y_axis_type(server, page):
    page.goto(f"{server}/runs/alpha")
    until(page, f"{traces('chart-loss', 'line')}.length === 1")
    page.check("#log-y")
    for chart in ("chart-tflops", "chart-step_time", "chart-loss"):
        until(page, f"document.querySelector('#{chart} .plot').layout.yaxis.type === 'log'")
    assert query(page)["log"] == ["1"]
    page.uncheck("#log-y")
    until(page, "document.querySelector('#chart-loss .plot').layout.yaxis.type === 'linear'")
    assert "log" not in query(page)


def test_smoothing_draws_the_ema_over_the_raw_line(server, page):
    page.goto(f"{server}/runs/alpha")
    until(page, f"{traces('chart-loss', 'line')}.length === 1")
    page.fill("#smoothing", "0.6")
    until(page, f"{traces('chart-loss', 'smoothed')}.length === 1")
    raw = page.evaluate(f"{traces('chart-loss', 'line')}[0]")
    smooth = page.evaluate(f"{traces('chart-loss', 'smoothed')}[0]")
    loss = series(server, "alpha")["loss"]
    assert raw["y"] == pytest.approx(loss, rel=1e-12)
    assert smooth["y"] == pytest.approx(ema(loss, 0.6), rel=1e-12)
    assert smooth["y"] != pytest.approx(loss)
    assert raw["opacity"] < 1 and raw["showlegend"] is False  # the raw line stays, lighter
    assert query(page)["smooth"] == ["0.6"]
    # Hovering lists the smoothed line alone: the faded raw line is drawn, not hovered.
    page.evaluate(f"Plotly.Fx.hover(document.querySelector('#chart-loss .plot'), {{xval: {3 * STEPS}}})")
    until(page, "document.querySelector('#chart-loss .hoverlayer .legend') !== null")
    assert page.locator("#chart-loss .hoverlayer .legend .traces").count() == 1
    # The CSV holds the measured values, not the smoothed ones.
    with page.expect_download() as download:
        page.click("#chart-loss .csv-link")
    rows = list(csv.DictReader(io.StringIO(Path(download.value.path()).read_text())))
    assert [float(row["loss"]) for row in rows] == pytest.approx(loss, rel=1e-12)


def test_the_url_keeps_the_settings_through_a_reload(server, page):
    page.goto(f"{server}/runs/alpha")
    until(page, f"{traces('chart-tflops', 'line')}.length === 3")
    page.select_option("#x-axis", "tokens")
    page.check("#log-y")
    page.fill("#smoothing", "0.3")
    until(page, f"{traces('chart-tflops', 'smoothed')}.length === 3")
    assert query(page) == {"x": ["tokens"], "log": ["1"], "smooth": ["0.3"]}
    page.reload()
    until(page, f"{traces('chart-tflops', 'smoothed')}.length === 3")
    assert page.input_value("#x-axis") == "tokens"
    assert page.is_checked("#log-y")
    assert page.input_value("#smoothing") == "0.3"
    plot = page.evaluate(
        "(() => { const p = document.querySelector('#chart-tflops .plot');"
        " return { x: p.data.find(t => t.meta.kind === 'line').x, title: p.layout.xaxis.title.text,"
        " y: p.layout.yaxis.type }; })()"
    )
    tokens = series(server, "alpha")["tokens"]
    assert plot["x"] == [sum(tokens[: i + 1]) for i in range(len(tokens))]
    assert plot["title"].startswith("tokens seen") and plot["y"] == "log"


def overlay(page):
    """The first overlay's lines (`#overlays .plot` is the first overlay card's plot)."""
    return page.evaluate(f"{traces('overlays', 'line')}.map(t => ({{name: t.name, y: t.y}}))")


def test_compare_overlay_switches_metric_and_keeps_it_in_the_url(server, page):
    page.goto(f"{server}/compare?run_id=alpha&run_id=beta")
    until(page, f"{traces('overlays', 'line')}.length === 2")
    page.select_option("#overlays .overlay-metric", "loss")
    want = {run_id: series(server, run_id)["loss"] for run_id in ("alpha", "beta")}
    until(page, f"{traces('overlays', 'line')}.every(t => t.meta.column === 'loss')")
    assert query(page)["metric"] == ["loss"]
    assert query(page)["run_id"] == ["alpha", "beta"]
    for trace in overlay(page):
        assert trace["y"] == pytest.approx(want[trace["name"]], rel=1e-12)
    page.reload()
    until(page, f"{traces('overlays', 'line')}.length === 2")
    assert page.input_value("#overlays .overlay-metric") == "loss"
    assert {t["name"] for t in overlay(page)} == {"alpha", "beta"}
    assert all(t["y"] == pytest.approx(want[t["name"]], rel=1e-12) for t in overlay(page))


def test_the_legend_above_a_chart_hides_a_line_with_its_band_and_shows_one_alone(server, page):
    """The page draws the legend (plotly's is off, so a live extension does not redraw it): a click
    hides an entry's line and band and is kept through a redraw; a double click shows one alone."""
    page.goto(f"{server}/runs/alpha")
    until(page, f"{traces('chart-tflops', 'line')}.length === 3")
    labels = {m["name"]: m["label"] for m in httpx.get(f"{server}/api/v1/catalogue").json()["metrics"]}
    entries = page.locator("#chart-tflops .chart-legend .legend-entry")
    assert entries.all_text_contents() == [labels[f"tflops_{kind}"] for kind in ("useful", "thd", "bshd")]
    plot = "document.querySelector('#chart-tflops .plot')"
    assert page.evaluate(f"{plot}._fullLayout.showlegend") is False
    assert page.locator("#chart-tflops .plot .legend").count() == 0
    visible = f"Object.fromEntries({plot}.data.map(t => [t.meta.column, t.visible ?? true]))"
    before = page.evaluate(visible)
    hidden_of = {column: "legendonly" if shown is True else shown for column, shown in before.items()}

    entries.nth(1).click()
    until(page, f"{visible}.tflops_thd === 'legendonly'")
    after = page.evaluate(visible)
    thd = [c for c in after if c.startswith("tflops_thd")]
    assert len(thd) == 3 and all(after[c] == hidden_of[c] for c in thd)  # the line and its band's edges
    assert all(after[c] == before[c] for c in after if c not in thd)
    assert entries.nth(1).get_attribute("aria-pressed") == "false"

    page.fill("#smoothing", "0.6")  # a whole redraw: the entry stays hidden, its smoothed line too
    until(page, f"{traces('chart-tflops', 'smoothed')}.length === 3")
    smoothed = page.evaluate(f"{traces('chart-tflops', 'smoothed')}.map(t => [t.meta.column, t.visible ?? true])")
    assert dict(smoothed) == {"tflops_useful": True, "tflops_thd": "legendonly", "tflops_bshd": True}

    entries.nth(0).dblclick()  # useful alone
    shown = f"{traces('chart-tflops', 'smoothed')}.filter(t => t.visible !== 'legendonly').map(t => t.meta.column)"
    until(page, f"{shown}.join() === 'tflops_useful'")
    assert [e.get_attribute("aria-pressed") for e in entries.all()] == ["true", "false", "false"]
    entries.nth(0).dblclick()  # alone already: all shown again
    until(page, f"{shown}.length === 3")
