"""The run page's live path draws only what arrived (ChartPanel.extend, extension.js): after live
events one at a time, every series chart holds exactly the traces that a fresh load of the page
draws, smoothing included; the charts out of view catch up when scrolled to, and a zoom made
before the events stays, on the zoomed chart and on those linked to it."""

import httpx
import pytest
from browser_support import run_body, running_server, until
from wire_records import packed_interval

pytestmark = pytest.mark.browser

FIRST = 5  # intervals before the page opens
LIVE = 6  # posted one at a time while it is open
SMOOTHING = "0.6"
ZOOM = (15, 75)  # an x (step) range zoomed into before the live events
HEADLINE = "document.querySelector('#chart-tflops .plot')"
# Plotly.extendTraces calls on the headline chart, counted by a wrapper the page loads first.
COUNT_EXTENSIONS = """
window.extensions = 0;
const wrap = () => {
  if (!window.Plotly) return setTimeout(wrap, 5);
  const extendTraces = Plotly.extendTraces;
  Plotly.extendTraces = function (plot, ...rest) {
    if (plot.closest('#chart-tflops')) window.extensions += 1;
    return extendTraces.call(this, plot, ...rest);
  };
};
wrap();
"""
# Each series chart (run.js marks its card data-series): empty, or its traces' points and look.
CHARTS = """[...document.querySelectorAll('.chart[data-series]')].map(card => [card.dataset.series,
  card.classList.contains('is-empty') ? card.querySelector('.empty').textContent
    : (card.querySelector('.plot').data || [])
      .map(t => ({name: t.name, kind: t.meta.kind, x: t.x, y: t.y, opacity: t.opacity ?? 1}))])"""


def interval(k):
    record = packed_interval(k, gpu_time_s=0.5 + 0.07 * (k % 4), loss=4.0 - 0.2 * k + 0.05 * (k % 3))
    # A second channel from the first live interval on: the channel chart gains a line live.
    record["channel_loss"] = {"code": 2.5 - 0.1 * k, **({"math": 3.0 - 0.1 * k} if k >= FIRST else {})}
    record["channel_tokens"] = {"code": 800, **({"math": 200} if k >= FIRST else {})}
    return record


def post(base, ks):
    body = {"intervals": [interval(k) for k in ks]}
    assert httpx.post(f"{base}/api/v1/runs/growing/intervals", json=body).status_code == 200


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = tmp_path_factory.mktemp("live-extension") / "live.db"
    with running_server(db, PACKSCOPE_STREAM_POLL_S="0.2") as base:
        assert httpx.post(f"{base}/api/v1/runs", json=run_body("growing")).status_code == 201
        post(base, range(FIRST))
        yield base


def charts_when_caught_up(page, points):
    """Every series chart, once each has been in view and holds `points` points (or is empty)."""
    ids = page.evaluate("[...document.querySelectorAll('.chart[data-series]')].map(c => c.dataset.series)")
    for chart in ids:
        if page.is_visible(f"#chart-{chart}"):
            page.locator(f"#chart-{chart}").scroll_into_view_if_needed()
            until(
                page,
                f"document.querySelector('#chart-{chart}').classList.contains('is-empty') || "
                f"document.querySelector('#chart-{chart} .plot').data.every(t => t.x.length === {points})",
            )
    return dict(page.evaluate(CHARTS))


def test_live_events_draw_what_a_fresh_load_draws(server, page, context):
    page.add_init_script(COUNT_EXTENSIONS)
    page.goto(f"{server}/runs/growing?smooth={SMOOTHING}")
    until(page, f"{HEADLINE}.data?.some(t => t.x.length === {FIRST})")
    page.wait_for_selector("#live.on")
    page.evaluate(f"Plotly.relayout({HEADLINE}, {{'xaxis.range': {list(ZOOM)}}})")
    for k in range(FIRST, FIRST + LIVE):
        post(server, [k])
        until(page, f"{HEADLINE}.data.every(t => t.x.length === {k + 1})", timeout=10_000)
    live = charts_when_caught_up(page, FIRST + LIVE)
    for chart in ("tflops", "loss", "step_time"):  # linked zoom (linkedzoom.js) follows the headline's
        assert page.evaluate(f"document.querySelector('#chart-{chart} .plot').layout.xaxis.range") == list(ZOOM)
    # The headline chart grew by extension, one event at a time, not by drawings anew.
    assert page.evaluate("window.extensions") >= LIVE

    fresh_page = context.new_page()
    fresh_page.goto(f"{server}/runs/growing?smooth={SMOOTHING}")
    until(fresh_page, f"{HEADLINE}.data?.some(t => t.x.length === {FIRST + LIVE})")
    fresh = charts_when_caught_up(fresh_page, FIRST + LIVE)
    fresh_page.close()

    assert sorted(live) == sorted(fresh)
    drawn = [chart for chart, traces in fresh.items() if not isinstance(traces, str)]
    assert {"tflops", "loss", "channels", "step_time"} <= set(drawn)
    for chart in fresh:
        assert live[chart] == fresh[chart], chart
    # Smoothing was on: the headline holds faded raw lines and their smoothed copies.
    kinds = [t["kind"] for t in live["tflops"]]
    assert kinds.count("smoothed") == 3 and kinds.count("line") == 3
    assert {t["name"] for t in live["channels"]} == {"code", "math"}


def test_the_headline_draws_a_posted_interval_from_the_event_alone(server, page):
    """The event carries the new intervals' series (issue 39): the page draws them without asking.
    Here every request for a part of the series (step_min) is answered with nothing new, so what
    the chart gains can come from the events only; it must equal the series endpoint's values."""
    run = "unasked"
    assert httpx.post(f"{server}/api/v1/runs", json=run_body(run)).status_code == 201
    body = {"intervals": [interval(k) for k in range(3)]}
    assert httpx.post(f"{server}/api/v1/runs/{run}/intervals", json=body).status_code == 200
    nothing_new = httpx.get(f"{server}/api/v1/runs/{run}/series", params={"step_min": 10**12}).text

    def answer_nothing_new(route):  # the status poll's too (every 10 s): it adds nothing either
        route.fulfill(status=200, content_type="application/json", body=nothing_new)

    page.route("**/series?*step_min=*", answer_nothing_new)
    page.goto(f"{server}/runs/{run}")
    until(page, f"{HEADLINE}.data?.some(t => t.x.length === 3)")
    page.wait_for_selector("#live.on")
    for k in range(3, 6):
        body = {"intervals": [interval(k)]}
        assert httpx.post(f"{server}/api/v1/runs/{run}/intervals", json=body).status_code == 200
        until(page, f"{HEADLINE}.data.every(t => t.x.length === {k + 1})", timeout=10_000)
    held = httpx.get(f"{server}/api/v1/runs/{run}/series", params={"max_points": 500}).json()["columns"]
    drawn = page.evaluate(f"{HEADLINE}.data.map(t => [t.meta.column, t.x, t.y])")
    assert {column for column, _, _ in drawn} >= {"tflops_useful", "tflops_useful_min", "tflops_thd", "tflops_bshd"}
    for column, x, y in drawn:
        assert x == held["step"] and y == held[column], column


def test_a_live_extension_keeps_the_margins_and_every_tick_label(server, page):
    """The headline's margins stay put while it grows (a margin that changes makes plotly draw the
    chart a second time, issue 39), and every tick label inside the plot shows: none is hidden now
    that plotly no longer checks for labels past the div."""
    run = "margins"
    assert httpx.post(f"{server}/api/v1/runs", json=run_body(run)).status_code == 201
    body = {"intervals": [interval(k) for k in range(8)]}
    assert httpx.post(f"{server}/api/v1/runs/{run}/intervals", json=body).status_code == 200
    page.goto(f"{server}/runs/{run}")
    until(page, f"{HEADLINE}.data?.some(t => t.x.length === 8)")
    page.wait_for_selector("#live.on")
    size = f"(({{l, r, t, b}}) => [l, r, t, b])({HEADLINE}._fullLayout._size)"
    labels = f"[...{HEADLINE}.querySelectorAll('.xtick text, .ytick text')]"
    sizes, last_ticks = [page.evaluate(size)], []
    for k in range(8, 12):  # steps 90-120: the x ticks reach the right end at 100 and 120
        assert httpx.post(f"{server}/api/v1/runs/{run}/intervals", json={"intervals": [interval(k)]}).status_code == 200
        until(page, f"{HEADLINE}.data.every(t => t.x.length === {k + 1})", timeout=10_000)
        page.evaluate("new Promise(r => requestAnimationFrame(() => r()))")
        sizes.append(page.evaluate(size))
        last_ticks.append(page.evaluate(f"{labels}.filter(t => t.closest('.xtick')).map(t => t.textContent).at(-1)"))
        assert page.evaluate(f"{labels}.every(t => getComputedStyle(t).display !== 'none')")
    assert {tuple(s) for s in sizes} == {tuple(sizes[0])}, sizes
    assert "100" in last_ticks and "120" in last_ticks  # the right end reached a labelled tick


def test_a_tick_label_that_outgrows_the_kept_margins_gets_the_room_a_fresh_load_gives_it(server, page, context):
    """A live extension keeps the margins the last drawing measured (charts.js, issue 39); when a
    new point brings y tick labels longer than any drawn before (here TFLOP/s a thousand times higher), the chart is
    drawn again with its axes measured: its left margin is then a fresh load's, wider than before."""
    run = "outgrown"
    assert httpx.post(f"{server}/api/v1/runs", json=run_body(run)).status_code == 201
    body = {"intervals": [interval(k) for k in range(6)]}
    assert httpx.post(f"{server}/api/v1/runs/{run}/intervals", json=body).status_code == 200
    page.add_init_script(COUNT_EXTENSIONS)
    page.goto(f"{server}/runs/{run}")
    until(page, f"{HEADLINE}.data?.some(t => t.x.length === 6)")
    page.wait_for_selector("#live.on")
    left = f"{HEADLINE}._fullLayout._size.l"
    narrow = page.evaluate(left)
    faster = packed_interval(6, gpu_time_s=0.0005, loss=3.0)  # the same work in a thousandth of the time
    assert httpx.post(f"{server}/api/v1/runs/{run}/intervals", json={"intervals": [faster]}).status_code == 200
    until(page, f"{HEADLINE}.data.every(t => t.x.length === 7)", timeout=10_000)
    page.evaluate("new Promise(r => requestAnimationFrame(() => r()))")
    assert page.evaluate("window.extensions") >= 1  # it grew by extension, then was measured again
    live_left = page.evaluate(left)

    fresh = context.new_page()
    fresh.goto(f"{server}/runs/{run}")
    until(fresh, f"{HEADLINE}.data?.some(t => t.x.length === 7)")
    assert live_left == fresh.evaluate(left) > narrow
    fresh.close()
    # Every y tick label lies inside the chart's svg, none cut at its left edge.
    inside = f"""(() => {{ const svg = {HEADLINE}.querySelector('svg.main-svg').getBoundingClientRect();
      return [...{HEADLINE}.querySelectorAll('.ytick text')]
        .every(t => t.getBoundingClientRect().left >= svg.left); }})()"""
    assert page.evaluate(inside)
