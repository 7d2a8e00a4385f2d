"""The run page's first drawing in Debian's chromium: the headline chart as a still SVG from the
series answer, before plotly.js runs (run_early.js, first_chart.js, sketch.js), then replaced by
plotly's chart in the same box. plotly.js is held back by the test's route until the drawing has
been checked, so nothing here depends on timing."""

import math
import re

import httpx
import pytest
from browser_support import HELD, HeldPlotly, flat, run_body, running_server, sketch_scale, until, vertices
from wire_records import packed_interval

pytestmark = pytest.mark.browser

N = 1200  # more intervals than the page's 500 points: each point spans 2-3, so the bands have width
START = 1_764_406_800.0
LINES = ("tflops_bshd", "tflops_thd", "tflops_useful")
SKETCH = "document.querySelector('#chart-tflops .plot > svg.sketch')"
PLOT = "document.querySelector('#chart-tflops .plot')"


def record(k):
    r = packed_interval(k, gpu_time_s=0.4 + 0.3 * ((7 * k) % 11) / 11, loss=3.0)
    r["wall_start"] = START + 30.0 * k
    r["wall_end"] = r["wall_start"] + 25.0
    return r


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("first") / "first.db") as base:
        assert httpx.post(f"{base}/api/v1/runs", json=run_body("long")).status_code == 201
        for start in range(0, N, 400):
            body = {"intervals": [record(k) for k in range(start, start + 400)]}
            assert httpx.post(f"{base}/api/v1/runs/long/intervals", json=body).status_code == 200
        assert httpx.post(f"{base}/api/v1/runs", json=run_body("empty")).status_code == 201
        yield base


def hms(seconds):
    whole = round(abs(seconds))
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def sketch_of(page):
    return page.evaluate(
        f"""(() => {{
        const svg = {SKETCH};
        const area = svg.querySelector('rect.plot-area');
        const paths = (kind) => [...svg.querySelectorAll(`path.${{kind}}`)].map((p) => ({{
          name: p.dataset.name, d: p.getAttribute('d'), stroke: p.getAttribute('stroke'),
          fill: p.getAttribute('fill'), dash: p.getAttribute('stroke-dasharray'), opacity: p.getAttribute('opacity'),
        }}));
        return {{
          role: svg.getAttribute('role'), label: svg.getAttribute('aria-label'),
          width: svg.getBoundingClientRect().width, height: svg.getBoundingClientRect().height,
          area: ['x', 'y', 'width', 'height'].map((k) => Number(area.getAttribute(k))),
          x: svg.dataset.xRange.split(' ').map(Number), y: svg.dataset.yRange.split(' ').map(Number),
          lines: paths('line'), bands: paths('band'),
          legend: [...document.querySelectorAll('#chart-tflops .chart-legend .legend-entry')].map((b) => b.textContent),
          texts: [...svg.querySelectorAll(':scope > text')].map((t) => t.textContent),
        }};
      }})()"""
    )


def test_the_headline_chart_is_drawn_from_the_series_answer_before_plotly_and_replaced_by_it(page, server):
    series = httpx.get(f"{server}/api/v1/runs/long/series", params={"max_points": 500}).json()
    catalogue = {m["name"]: m for m in httpx.get(f"{server}/api/v1/catalogue").json()["metrics"]}
    columns = series["columns"]
    assert series["points"] == 500
    held = HeldPlotly(page)
    page.goto(f"{server}/runs/long", wait_until=HELD)
    until(page, f"{SKETCH}?.querySelector('path.line') != null")
    assert page.evaluate("typeof Plotly") == "undefined"  # drawn without plotly.js
    sketch = sketch_of(page)
    assert sketch["role"] == "img"
    assert sketch["label"].startswith("TFLOP/s per GPU by step: ") and "500 points" in sketch["label"]
    labels = [catalogue[name]["label"] for name in LINES]
    assert all(label in sketch["label"] for label in labels)
    assert sketch["legend"] == [catalogue[f"tflops_{kind}"]["label"] for kind in ("useful", "thd", "bshd")]  # by rank
    assert {"TFLOP/s per GPU", "step"} <= set(sketch["texts"])

    # Every line is the series' own points, at their place on the drawn axes: one vertex a point.
    px, py = sketch_scale(sketch)
    assert sketch["x"] == [min(columns["step"]), max(columns["step"])]  # lines: x exactly over the data
    drawn = {line["name"]: line for line in sketch["lines"]}
    for name in LINES:
        (points,) = vertices(drawn[catalogue[name]["label"]]["d"])
        assert len(points) == 2 * series["points"]
        expected = [(px(x), py(y)) for x, y in zip(columns["step"], columns[name], strict=True)]
        assert points == pytest.approx(flat(expected), abs=0.011)
    # One band a count, from its max edge along to its min edge back.
    assert len(sketch["bands"]) == 3
    for band in sketch["bands"]:
        column = next(n for n in LINES if band["name"] == f"{catalogue[n]['label']} min")
        (outline,) = vertices(band["d"].rstrip("Z"))
        upper = [(px(x), py(y)) for x, y in zip(columns["step"], columns[f"{column}_max"], strict=True)]
        lower = [(px(x), py(y)) for x, y in zip(columns["step"], columns[f"{column}_min"], strict=True)]
        assert outline == pytest.approx(flat(upper + lower[::-1]), abs=0.011)
        assert any(hi > lo for hi, lo in zip(columns[f"{column}_max"], columns[f"{column}_min"], strict=True))
    assert "shaded: min–max" in page.text_content("#chart-tflops .note")
    box = page.evaluate("JSON.stringify(document.querySelector('#chart-tflops').getBoundingClientRect())")

    # plotly.js runs after the drawing; its chart takes the drawing's place, in the same box, with
    # the same points, colours and axis ranges.
    held.release(page)
    until(page, f"{PLOT}._fullLayout !== undefined && {SKETCH} === null", timeout=30_000)
    assert page.evaluate("JSON.stringify(document.querySelector('#chart-tflops').getBoundingClientRect())") == box
    assert page.evaluate(f"{PLOT}.querySelectorAll('svg.sketch').length") == 0
    # The legend above the still is plotly's chart's, now clickable, drawn once.
    legend = page.locator("#chart-tflops .chart-legend .legend-entry").all_text_contents()
    assert legend == sketch["legend"]
    traces = page.evaluate(f"{PLOT}.data.filter(t => t.meta.kind === 'line')")
    for trace in traces:
        assert trace["x"] == columns["step"] and trace["y"] == columns[trace["meta"]["column"]]
        assert drawn[trace["name"]]["stroke"] == trace["line"]["color"]
    ranges = page.evaluate(f"[{PLOT}._fullLayout.xaxis.range, {PLOT}._fullLayout.yaxis.range]")
    assert ranges[0] == pytest.approx(sketch["x"], rel=1e-9) and ranges[1] == pytest.approx(sketch["y"], rel=1e-9)
    assert page.text_content("#chart-tflops .note").count("shaded: min–max") == 1
    assert page.evaluate(f"{PLOT}.data.filter(t => t.meta.kind === 'band').map(t => t.visible)") == [True] * 6


def test_the_first_drawing_follows_the_linked_settings_and_plotly_hovers_read_h_mm_ss(page, server):
    series = httpx.get(f"{server}/api/v1/runs/long/series", params={"max_points": 500}).json()
    held = HeldPlotly(page)
    page.goto(f"{server}/runs/long?x=elapsed&smooth=0.6", wait_until=HELD)
    until(page, f"{SKETCH}?.querySelector('path.line') != null")
    sketch = sketch_of(page)
    assert "relative time since the run's first interval (h:mm:ss)" in sketch["texts"]
    # Smoothing: each line twice, faded raw points under the smoothed ones (as plotly draws them).
    assert len(sketch["lines"]) == 6 and [line["opacity"] for line in sketch["lines"][:3]] == ["0.3"] * 3
    elapsed = [t - series["wall_origin"] for t in series["columns"]["wall_end_max"]]
    px, _ = sketch_scale(sketch)
    (points,) = vertices(sketch["lines"][2]["d"])  # useful, raw
    assert points[::2] == pytest.approx([px(x) for x in elapsed], abs=0.011)
    ticks = [t for t in sketch["texts"] if re.fullmatch(r"\d+:\d\d:\d\d", t)]
    assert len(ticks) >= 3

    held.release(page)
    until(page, f"{PLOT}._fullLayout !== undefined && {SKETCH} === null", timeout=30_000)
    axis = page.evaluate(f"{PLOT}.layout.xaxis")
    assert ticks == axis["ticktext"]
    # Hovering a point titles the unified hover with its time as h:mm:ss, as the ticks read.
    k = 250
    page.evaluate(f"Plotly.Fx.hover({PLOT}, {{xval: {elapsed[k]}}})")
    until(page, f"{PLOT}.querySelector('.hoverlayer .legend') !== null")
    assert page.text_content("#chart-tflops .hoverlayer .legendtitletext") == hms(elapsed[k])


def test_a_run_without_intervals_draws_nothing_early_and_still_loads_plotly(page, server):
    page.goto(f"{server}/runs/empty")
    until(page, "typeof Plotly !== 'undefined'", timeout=30_000)
    until(page, "document.querySelector('#chart-tflops').classList.contains('is-empty')")
    assert page.evaluate(f"{SKETCH} === null")
    assert page.text_content("#chart-tflops .empty") == "Waiting for the first interval…"


def test_the_drawing_s_axis_ranges_match_plotly_on_a_log_axis(page, server):
    held = HeldPlotly(page)
    page.goto(f"{server}/runs/long?log=1", wait_until=HELD)
    until(page, f"{SKETCH}?.querySelector('path.line') != null")
    sketch = sketch_of(page)
    held.release(page)
    until(page, f"{PLOT}._fullLayout !== undefined && {SKETCH} === null", timeout=30_000)
    plotly_y = page.evaluate(f"{PLOT}._fullLayout.yaxis.range")
    assert plotly_y == pytest.approx(sketch["y"], rel=1e-6)
    assert all(math.isfinite(v) for v in sketch["y"])


def test_the_first_drawing_places_points_at_their_wall_clock_time(page, server):
    series = httpx.get(f"{server}/api/v1/runs/long/series", params={"max_points": 500}).json()
    ends = series["columns"]["wall_end_max"]
    held = HeldPlotly(page)
    page.goto(f"{server}/runs/long?x=wall", wait_until=HELD)
    until(page, f"{SKETCH}?.querySelector('path.line') != null")
    sketch = sketch_of(page)
    assert sketch["x"] == pytest.approx([1000 * min(ends), 1000 * max(ends)], abs=1)  # ms, read back from local times
    px, _ = sketch_scale(sketch)
    (points,) = vertices(sketch["lines"][0]["d"])
    assert points[::2] == pytest.approx([px(1000 * t) for t in ends], abs=0.02)
    assert len([t for t in sketch["texts"] if re.fullmatch(r"\d\d:\d\d", t)]) >= 3  # hh:mm ticks over 10 hours
    held.release(page)
    until(page, f"{PLOT}._fullLayout?.xaxis.type === 'date' && {SKETCH} === null", timeout=30_000)


def test_the_page_takes_the_answers_its_head_preloaded_and_asks_each_once(page, server):
    asked = []
    page.on("request", lambda request: asked.append(request.url.removeprefix(server)))
    page.goto(f"{server}/runs/long")
    until(page, f"{PLOT}._fullData?.length > 0", timeout=30_000)
    first = ["/api/v1/catalogue", "/api/v1/runs/long", "/api/v1/runs/long/series?max_points=500"]
    # One request each: the preload's; a fetch that did not take it would make a second.
    assert [asked.count(path) for path in first] == [1, 1, 1]
    initiators = page.evaluate(
        "performance.getEntriesByType('resource').filter(r => r.name.includes('/api/v1/')).map(r => r.initiatorType)"
    )
    assert initiators.count("link") == 3
    # plotly.js is asked after the first answers (preloaded last), once: run_early.js's script
    # takes the preload.
    assert asked.count("/vendor/plotly.min.js") == 1
    assert asked.index("/vendor/plotly.min.js") > asked.index("/api/v1/runs/long/series?max_points=500")
