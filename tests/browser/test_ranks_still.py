"""The Ranks panel's first drawing in Debian's chromium: for a run of several ranks, the ranks
answer asked for early (run_early.js) and both charts drawn from it as stills before plotly.js
runs (ranks_sketch.js: the heatmap by heatmap_sketch.js, the lines by sketch.js), then replaced by
plotly's charts in the same boxes; a one-rank run never asks for the ranks. plotly.js is held back
by the test's route until the stills have been checked, so nothing here depends on timing."""

from itertools import pairwise

import httpx
import pytest
from browser_support import HELD, HeldPlotly, flat, run_body, running_server, sketch_scale, until, vertices
from wire_records import packed_interval

pytestmark = pytest.mark.browser

RANKS = 8
INTERVALS = 24
STRAGGLER = 5
MISSING = (3, 10)  # rank 3 never sent interval 10: its cell stays empty
HEATMAP = "document.querySelector('#chart-rank_heatmap .plot')"
SPREAD = "document.querySelector('#chart-rank_spread .plot')"
STILL = "querySelector(':scope > svg.sketch')"


def steps_of(k):
    return 10 + 5 * (k % 3)  # uneven intervals: the bricks' widths differ


def ranked_intervals(ranks, intervals, slow):
    """Each rank's record of each interval, steps counted on across intervals of uneven length."""
    records, first = [], 1
    for k in range(intervals):
        steps = steps_of(k)
        for rank in range(ranks):
            if (rank, k) == MISSING and ranks == RANKS:
                continue
            record = packed_interval(k, steps=steps, gpu_time_s=steps * 0.05 * slow(rank, k))
            records.append({**record, "rank": rank, "first_step": first, "last_step": first + steps - 1})
        first += steps
    return records


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("ranks") / "ranks.db") as base:

        def run(run_id, records):
            assert httpx.post(f"{base}/api/v1/runs", json=run_body(run_id)).status_code == 201
            answer = httpx.post(f"{base}/api/v1/runs/{run_id}/intervals", json={"intervals": records})
            assert answer.status_code == 200, answer.text

        run(
            "eight",
            ranked_intervals(RANKS, INTERVALS, lambda r, k: 1.4 if r == STRAGGLER else 1 + 0.01 * ((r + k) % 7)),
        )
        run("seventy", ranked_intervals(70, 3, lambda r, k: 1.5 if r == 33 else 1 + r / 100))
        run("single", ranked_intervals(1, 6, lambda r, k: 1.0))
        run("flat", ranked_intervals(4, 6, lambda r, k: 1.4 if r == 2 else 1.0))  # one spread throughout
        yield base


def ranks_answer(server, run_id):
    return httpx.get(f"{server}/api/v1/runs/{run_id}/ranks", params={"max_points": 200}).json()


def rgb(text):
    return [int(v) for v in text[text.index("(") + 1 : -1].split(",")[:3]]


def colour_on(scale, t):
    """A value's colour on a plotly colour scale, mixed in sRGB between its two stops."""
    t = min(1.0, max(0.0, t))
    k = next(i for i in range(1, len(scale)) if scale[i][0] >= t or i == len(scale) - 1)
    (t0, c0), (t1, c1) = scale[k - 1], scale[k]
    f = (t - t0) / (t1 - t0)
    return [a + (b - a) * f for a, b in zip(rgb(c0), rgb(c1), strict=True)]


# The RGBA of the still heatmap's canvas at each [x, y] (CSS px from the plot area's corner).
CANVAS_PIXELS = """points => {
  const canvas = document.querySelector('#chart-rank_heatmap .plot > svg.sketch canvas.cells');
  const scale = canvas.width / canvas.getBoundingClientRect().width;
  const data = canvas.getContext('2d').getImageData(0, 0, canvas.width, canvas.height).data;
  return points.map(([x, y]) => {
    const at = 4 * (Math.floor(y * scale) * canvas.width + Math.floor(x * scale));
    return [...data.slice(at, at + 4)];
  });
}"""


def still_of(page, plot):
    return page.evaluate(
        f"""(() => {{
        const svg = {plot}.{STILL};
        const area = svg.querySelector('rect.plot-area');
        return {{
          label: svg.getAttribute('aria-label'),
          area: ['x', 'y', 'width', 'height'].map((k) => Number(area.getAttribute(k))),
          x: svg.dataset.xRange.split(' ').map(Number),
          y: svg.dataset.yRange?.split(' ').map(Number),
          z: svg.dataset.zRange?.split(' ').map(Number),
          lines: [...svg.querySelectorAll('path.line')].map(p => ({{name: p.dataset.name, d: p.getAttribute('d')}})),
          texts: [...svg.querySelectorAll(':scope > text')].map((t) => t.textContent),
          colorbar: svg.querySelector('rect.colorbar') !== null,
        }};
      }})()"""
    )


def boxes(page):
    return page.evaluate(
        "['#chart-rank_heatmap', '#chart-rank_spread']"
        ".map(s => (b => [b.width, b.height])(document.querySelector(s).getBoundingClientRect()))"
    )


def test_the_ranks_heatmap_and_spread_are_drawn_before_plotly_and_replaced_by_it(sized_page, server):
    ranks = ranks_answer(server, "eight")
    assert ranks["matrix"] and ranks["rank_count"] == RANKS and len(ranks["step"]) == INTERVALS
    page = sized_page(1280, 800)
    asked = []
    page.on("request", lambda request: "/api/v1/runs/eight/ranks" in request.url and asked.append(request.url))
    held = HeldPlotly(page)
    page.goto(f"{server}/runs/eight", wait_until=HELD)
    until(
        page,
        f"{HEATMAP}.{STILL}?.querySelector('canvas.cells') != null"
        f" && {SPREAD}.{STILL}?.querySelector('path.line') != null",
    )
    assert page.evaluate("typeof Plotly") == "undefined"  # drawn without plotly.js
    assert not page.eval_on_selector("#ranks", "e => e.hidden")
    heatmap = still_of(page, HEATMAP)
    assert heatmap["label"].startswith(f"Step time per rank: {RANKS} ranks by {INTERVALS} intervals")
    assert [f"rank {r}" for r in range(RANKS)] == [t for t in heatmap["texts"] if t.startswith("rank ")]
    assert {"step", "s/step"} <= set(heatmap["texts"]) and heatmap["colorbar"]

    # A cell for each value the answer has, none for the missing one; each brick centred on its
    # step with its edges halfway to its neighbours', row k (rank k) above row k - 1: read back from
    # the canvas 2 px inside each edge of each cell and at its centre.
    z, steps = ranks["step_time_s"], ranks["step"]
    assert z[MISSING[0]][MISSING[1]] is None
    edges = [
        1.5 * steps[0] - 0.5 * steps[1],
        *((a + b) / 2 for a, b in pairwise(steps)),
        1.5 * steps[-1] - 0.5 * steps[-2],
    ]
    assert heatmap["x"] == pytest.approx([edges[0], edges[-1]])
    assert len({round(b - a, 6) for a, b in pairwise(edges)}) > 1  # uneven intervals
    _, _, width, height = heatmap["area"]
    px = lambda x: (x - edges[0]) / (edges[-1] - edges[0]) * width  # noqa: E731
    row = height / RANKS
    cells = [(k, i, v) for k, values in enumerate(z) for i, v in enumerate(values)]
    samples = []
    for k, i, _ in cells:
        x0, x1, y1 = px(edges[i]), px(edges[i + 1]), height - k * row
        mid = ((x0 + x1) / 2, y1 - row / 2)
        samples.append([mid, (x0 + 2, mid[1]), (x1 - 2, mid[1]), (mid[0], y1 - row + 2), (mid[0], y1 - 2)])
    pixels = page.evaluate(CANVAS_PIXELS, [p for points in samples for p in points])
    painted = [pixels[5 * n : 5 * n + 5] for n in range(len(cells))]
    for (k, i, v), seen in zip(cells, painted, strict=True):
        if v is None:
            assert all(p[3] == 0 for p in seen), (k, i, seen)  # left empty
        else:
            assert all(p == seen[0] and p[3] == 255 for p in seen), (k, i, seen)
    finite = [v for _, _, v in cells if v is not None]
    assert heatmap["z"] == [min(finite), max(finite)]
    spread_still = still_of(page, SPREAD)
    (line,) = spread_still["lines"]
    px_s, py_s = sketch_scale(spread_still)
    (points,) = vertices(line["d"])
    assert points == pytest.approx(
        flat([(px_s(x), py_s(y)) for x, y in zip(steps, ranks["spread"], strict=True)]), abs=0.011
    )
    latest = page.inner_text("#ranks-latest")
    assert f"rank {STRAGGLER} is slowest" in latest, latest
    before = boxes(page)

    # plotly.js runs after the stills; its charts take their places, in the same boxes, coloured
    # on the same scale over the same values, with the same x ranges.
    held.release(page)
    drawn = f"{HEATMAP}._fullLayout !== undefined && {SPREAD}._fullLayout !== undefined"
    until(page, f"{drawn} && {HEATMAP}.{STILL} === null && {SPREAD}.{STILL} === null", timeout=30_000)
    assert boxes(page) == before
    full = page.eval_on_selector(
        "#chart-rank_heatmap .plot",
        "p => (d => ({scale: d.colorscale, reverse: d.reversescale, zmin: d.zmin, zmax: d.zmax, z: d.z}))"
        "(p._fullData[0])",
    )
    assert full["z"] == z
    assert [full["zmin"], full["zmax"]] == heatmap["z"]
    plotly_scale = [[1 - t, c] for t, c in reversed(full["scale"])] if full["reverse"] else full["scale"]
    for (k, i, v), seen in zip(cells, painted, strict=True):
        if v is not None:
            expected = colour_on(plotly_scale, (v - full["zmin"]) / (full["zmax"] - full["zmin"]))
            assert seen[0][:3] == pytest.approx(expected, abs=0.51), (k, i, v, seen[0], expected)
    assert page.evaluate(f"{HEATMAP}._fullLayout.xaxis.range") == pytest.approx(heatmap["x"], rel=1e-9)
    assert page.evaluate(f"{SPREAD}._fullLayout.xaxis.range") == pytest.approx(spread_still["x"], rel=1e-9)
    assert page.evaluate(f"{SPREAD}._fullLayout.yaxis.range") == pytest.approx(spread_still["y"], rel=1e-9)
    assert page.inner_text("#ranks-latest") == latest
    assert len(asked) == 1  # ranks.js took the answer run_early.js asked for


def test_past_64_ranks_the_still_draws_the_quantile_lines_and_plotly_keeps_their_note(sized_page, server):
    ranks = ranks_answer(server, "seventy")
    assert not ranks["matrix"]
    page = sized_page(1280, 800)
    held = HeldPlotly(page)
    page.goto(f"{server}/runs/seventy", wait_until=HELD)
    until(page, f"{HEATMAP}.{STILL}?.querySelectorAll('path.line').length === 4")
    assert page.evaluate("typeof Plotly") == "undefined"
    still = still_of(page, HEATMAP)
    assert [line["name"] for line in still["lines"]] == ["slowest rank", "90th percentile", "median", "fastest rank"]
    px, py = sketch_scale(still)
    (slowest,) = vertices(still["lines"][0]["d"])
    assert slowest == pytest.approx(
        flat([(px(x), py(y)) for x, y in zip(ranks["step"], ranks["slowest_s"], strict=True)]), abs=0.011
    )
    title = page.inner_text("#chart-rank_heatmap h2")
    note = page.inner_text("#chart-rank_heatmap .card-head .note")
    assert title == "Step time over the ranks" and note.startswith("70 ranks: the slowest, 90th percentile")

    held.release(page)
    until(page, f"{HEATMAP}._fullData?.length === 4 && {HEATMAP}.{STILL} === null", timeout=30_000)
    assert page.inner_text("#chart-rank_heatmap h2") == title
    assert page.inner_text("#chart-rank_heatmap .card-head .note") == note
    assert page.evaluate(f"{HEATMAP}._fullLayout.yaxis.range") == pytest.approx(still["y"], rel=1e-9)


def test_a_one_rank_run_never_asks_for_the_ranks_nor_shows_the_panel(sized_page, server):
    page = sized_page(1280, 800)
    asked = []
    page.on("request", lambda request: "/api/v1/runs/single/ranks" in request.url and asked.append(request.url))
    held = HeldPlotly(page)
    page.goto(f"{server}/runs/single", wait_until=HELD)
    assert page.eval_on_selector("#run", "e => e.dataset.ranks") == "1"
    until(page, "document.querySelector('#chart-tflops .plot > svg.sketch path.line') != null")
    assert page.eval_on_selector("#ranks", "e => e.hidden")
    held.release(page)
    until(page, "document.querySelector('#chart-length_heatmap .plot')?._fullData?.[0]", timeout=30_000)
    assert page.eval_on_selector("#ranks", "e => e.hidden") and asked == []
    assert page.evaluate("document.querySelectorAll('#ranks svg.sketch').length") == 0


def test_a_spread_of_one_value_is_ranged_as_plotly_ranges_it(sized_page, server):
    spreads = ranks_answer(server, "flat")["spread"]
    assert len(set(spreads)) == 1
    page = sized_page(1280, 800)
    held = HeldPlotly(page)
    page.goto(f"{server}/runs/flat", wait_until=HELD)
    until(page, f"{SPREAD}.{STILL}?.querySelector('path.line') != null")
    still = still_of(page, SPREAD)
    assert still["y"] == pytest.approx([spreads[0] - 1, spreads[0] + 1])
    held.release(page)
    until(page, f"{SPREAD}._fullLayout !== undefined && {SPREAD}.{STILL} === null", timeout=30_000)
    assert page.evaluate(f"{SPREAD}._fullLayout.yaxis.range") == pytest.approx(still["y"], rel=1e-9)
