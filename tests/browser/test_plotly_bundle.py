"""The pages draw with plotly.js's bundle of three trace types (frontend/vendor/): every chart of
every page, with every panel shown, is drawn with the trace type it asked for. A type missing from
the bundle would not raise: plotly draws such a trace as a scatter without a word, so each plot's
drawn types are held to the asked ones, and to the bundle's list of types."""

import httpx
import pytest
from browser_support import run_body, running_server, until
from wire_records import packed_interval

from packscope.frontend import PLOTLY_JS

pytestmark = pytest.mark.browser

RANKS = 2  # the ranks panel shows from two ranks on
TELEMETRY = {"util_pct": 90.0, "power_w": 600.0, "sm_clock_mhz": 1900.0, "mem_used_bytes": 1e11, "energy_j": 300.0}
# Per plot on the page: [card id, [asked type, drawn type] per trace]. A trace without a type is a scatter.
PLOT_TYPES = """[...document.querySelectorAll('.js-plotly-plot')].map(p => [p.closest('[id]').id,
  p.data.map((t, i) => [t.type ?? 'scatter', p._fullData[i].type])])"""
BUNDLE_TYPES = "Object.keys(Plotly.PlotSchema.get().traces)"


def interval(k, rank):
    record = packed_interval(k, gpu_time_s=0.5 + 0.1 * rank, loss=4.0 - 0.1 * k, gpu=TELEMETRY)
    record["rank"] = rank
    record["channel_loss"] = {"code": 2.5 - 0.1 * k, "math": 3.0 - 0.1 * k}
    record["channel_tokens"] = {"code": 800, "math": 200}
    return record


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = tmp_path_factory.mktemp("plotly-bundle") / "bundle.db"
    with running_server(db) as base:
        for run_id in ("full", "other"):
            assert httpx.post(f"{base}/api/v1/runs", json=run_body(run_id)).status_code == 201
            body = {"intervals": [interval(k, rank) for k in range(6) for rank in range(RANKS)]}
            assert httpx.post(f"{base}/api/v1/runs/{run_id}/intervals", json=body).status_code == 200
        yield base


def test_the_server_serves_the_committed_partial_bundle(server):
    answer = httpx.get(f"{server}/vendor/plotly.min.js")
    assert answer.status_code == 200 and answer.content == PLOTLY_JS.read_bytes()


def drawn_types(page):
    plots = page.evaluate(PLOT_TYPES)
    known = set(page.evaluate(BUNDLE_TYPES))
    for card, traces in plots:
        for asked, drawn in traces:
            assert asked in known, f"{card}: {asked} is not in the bundle"
            assert drawn == asked, f"{card}: asked for {asked}, drawn as {drawn}"
    return {asked for _, traces in plots for asked, _ in traces}, {card for card, _ in plots}


def test_every_chart_of_the_run_page_is_drawn_with_its_own_type(server, page):
    page.goto(f"{server}/runs/full")
    charts = ["tflops", "channels", "gpu_power", "length_heatmap", "histogram"]
    until(page, " && ".join(f"document.querySelector('#chart-{c} .plot')?.data?.length > 0" for c in charts))
    until(page, "document.querySelector('#ranks .js-plotly-plot')?.data?.length > 0")
    types, cards = drawn_types(page)
    assert types == {"scatter", "bar", "heatmap"}
    assert {f"chart-{c}" for c in charts} <= cards


def test_every_chart_of_the_compare_page_is_drawn_with_its_own_type(server, page):
    page.goto(f"{server}/compare?run_id=full&run_id=other")
    until(page, "document.querySelector('#chart-tflops .plot')?.data?.length > 0")
    types, _ = drawn_types(page)
    assert "scatter" in types


def test_the_runs_page_runs_without_errors(server, page):
    page.goto(f"{server}/")
    page.wait_for_selector("tr[data-run-id=full]")
    # The page fixture fails the test on any console or page error.
