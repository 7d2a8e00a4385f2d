"""The dashboard in Debian's chromium against a real server: charts, values, live SSE updates."""

import re
from pathlib import Path

import httpx
import pytest
from browser_support import MODEL, run_body, running_server, until
from wire_records import packed_interval

from packscope.core.attention import window_sq

pytestmark = pytest.mark.browser

STEPS = 10
PACK = 4352  # eight 512-token documents and 256 slots of padding per pack
LINES = "document.querySelector('#chart-tflops .plot').data.filter(t => t.meta.kind === 'line')"


def interval(k, gpu_time_s, gpu=False):
    # Eight documents of 512 per pack: the dense baseline counts 8x the attention of THD.
    telemetry = {
        "util_pct": 90.0 + k,
        "power_w": 600.0,
        "sm_clock_mhz": 1900.0,
        "mem_used_bytes": 1e11,
        "energy_j": 300.0,
    }
    return packed_interval(
        k, steps=STEPS, pack=PACK, gpu_time_s=gpu_time_s, loss=5.0 - 0.1 * k, gpu=telemetry if gpu else None
    )


def post_intervals(base, run_id, ks, slowdown=1.0, gpu=False):
    body = {"intervals": [interval(k, slowdown * (0.5 + 0.05 * (k % 3)), gpu) for k in ks]}
    answer = httpx.post(f"{base}/api/v1/runs/{run_id}/intervals", json=body)
    assert answer.status_code == 200, answer.text


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    db = tmp_path_factory.mktemp("dashboard") / "dashboard.db"
    with running_server(db, PACKSCOPE_STREAM_POLL_S="0.2") as base:
        for run_id, name in [("live-run", "thd-live"), ("other-run", "thd-other")]:
            assert httpx.post(f"{base}/api/v1/runs", json=run_body(run_id, name, project="browser")).status_code == 201
        post_intervals(base, "live-run", range(12))
        post_intervals(base, "other-run", range(6), slowdown=1.25)
        for run_id, name in [("nvml-run", "with-nvml"), ("done-run", "finished")]:
            assert httpx.post(f"{base}/api/v1/runs", json=run_body(run_id, name, project="browser")).status_code == 201
        post_intervals(base, "nvml-run", range(2), gpu=True)
        post_intervals(base, "done-run", range(3))
        assert httpx.patch(f"{base}/api/v1/runs/done-run", json={"status": "finished"}).status_code == 200
        windowed = {**MODEL, "layer_kinds": ["sliding", "full", "sliding", "full"], "window": WINDOW}
        assert httpx.post(f"{base}/api/v1/runs", json={**run_body("window-run"), "model": windowed}).status_code == 201
        records = [windowed_interval(k) for k in range(3)]
        assert httpx.post(f"{base}/api/v1/runs/window-run/intervals", json={"intervals": records}).status_code == 200
        yield base


WINDOW = 256  # under the documents' 512 tokens: the sliding layers do less attention than the full ones


def windowed_interval(k):
    """An interval of the window run: the sums of its sliding layers beside the full ones'."""
    record = interval(k, 0.5)
    docs, packs = record["documents"], record["packs"]
    record["window_sq_sum_thd"] = docs * window_sq(512, WINDOW)
    record["window_sq_sum_bshd"] = packs * window_sq(PACK, WINDOW)
    return record


@pytest.fixture
def page(context):
    page = context.new_page()
    page.errors = []
    page.on("console", lambda m: m.type == "error" and page.errors.append(m.text))
    page.on("pageerror", lambda e: page.errors.append(str(e)))
    yield page
    page.close()


def catalogue(base):
    return {m["name"]: m for m in httpx.get(f"{base}/api/v1/catalogue").json()["metrics"]}


def last_values(base, run_id):
    """The last plotted value of each FLOPs count, keyed by the catalogue's label (the trace name)."""
    columns = httpx.get(f"{base}/api/v1/runs/{run_id}/series").json()["columns"]
    labels = catalogue(base)
    return {labels[name]["label"]: columns[name][-1] for name in ("tflops_bshd", "tflops_thd", "tflops_useful")}


def shown(base, run_id, metric="tflops_useful"):
    """A metric as the pages show it: without the run's first interval once it has a second."""
    run = httpx.get(f"{base}/api/v1/runs/{run_id}").json()
    assert run["steady"] is not None and run["steady"] != run["totals"]  # the live run has several intervals
    return run["steady"][metric]  # a rate; amounts (steps, tokens) stay the whole run's


def plotted(page):
    return {
        t["name"]: (len(t["y"]), t["y"][-1]) for t in page.evaluate(f"{LINES}.map(t => ({{name: t.name, y: t.y}}))")
    }


def test_run_page_draws_and_extends_live(server, page, tmp_path):
    page.goto(f"{server}/runs/live-run")
    until(page, f"document.querySelector('#chart-tflops .plot').data && {LINES}.length === 3")
    expected = last_values(server, "live-run")
    lines = plotted(page)
    assert sorted(lines) == sorted(expected)
    for name, value in expected.items():
        assert lines[name] == (12, pytest.approx(value, rel=1e-9))
    bshd, thd, useful = (
        expected[catalogue(server)[n]["label"]] for n in ("tflops_bshd", "tflops_thd", "tflops_useful")
    )
    assert bshd > thd > useful
    assert page.inner_text("[data-stat=tflops_useful] .value") == format(shown(server, "live-run"), "#.4g")
    assert "3.00" in page.inner_text("#sync-sites-body")
    labels = page.evaluate("document.querySelector('#chart-histogram .plot').data[0].x")
    assert "512–1023" in labels and "4096–8191" in labels

    # New intervals arrive through SSE and extend the traces; the page does not reload.
    page.evaluate("window.notReloaded = true")
    page.wait_for_selector("#live.on")
    post_intervals(server, "live-run", range(12, 15))
    until(page, f"{LINES}.every(t => t.y.length === 15)", timeout=10_000)
    assert page.evaluate("window.notReloaded === true")
    expected = last_values(server, "live-run")
    for name, (count, value) in plotted(page).items():
        assert count == 15 and value == pytest.approx(expected[name], rel=1e-9)
    until(page, "document.querySelector('[data-stat=steps] .value').textContent === '150'")

    page.screenshot(path=tmp_path / "run_page.png", full_page=True)
    assert page.errors == []


def test_chart_csv_holds_what_was_plotted(server, page):
    page.goto(f"{server}/runs/live-run")
    until(page, f"document.querySelector('#chart-tflops .plot').data && {LINES}.length === 3")
    with page.expect_download() as download:
        page.click("#chart-tflops .csv-link")
    assert download.value.suggested_filename == "live-run-tflops.csv"
    header, *rows = Path(download.value.path()).read_text().splitlines()
    assert header.startswith("step,tflops_bshd,tflops_thd,tflops_useful,tflops_bshd_max,")
    columns = httpx.get(f"{server}/api/v1/runs/live-run/series").json()["columns"]
    assert [int(row.split(",")[0]) for row in rows] == columns["step"]
    assert [float(row.split(",")[2]) for row in rows] == pytest.approx(columns["tflops_thd"], rel=1e-12)


def test_runs_page_lists_runs_and_compares(server, page, tmp_path):
    page.goto(server + "/")
    page.wait_for_selector("tr[data-run-id=live-run]")
    assert "thd-other" in page.inner_text("#runs-body")
    page.check("tr[data-run-id=live-run] input")
    page.check("tr[data-run-id=other-run] input")
    page.screenshot(path=tmp_path / "runs_page.png", full_page=True)
    page.click("#compare")
    page.wait_for_url("**/compare?run_id=live-run&run_id=other-run")
    until(page, "document.querySelector('#chart-tflops .plot').data?.length === 4")
    table = page.inner_text("#compare-table")
    assert "thd-live" in table and "thd-other" in table and catalogue(server)["overcount_pct"]["label"] in table
    # The other run's step time relative to the first (25% slower interval by interval; the table
    # leaves each run's first interval out, so the ratio of means is not exactly 1.25).
    live, other = (
        httpx.get(f"{server}/api/v1/runs/{r}").json()["steady"]["step_time_s"] for r in ("live-run", "other-run")
    )
    assert 0.2 < other / live - 1 < 0.3
    assert f"+{100 * (other / live - 1):.1f} %" in table
    test = httpx.get(f"{server}/api/v1/compare", params=[("run_id", "live-run"), ("run_id", "other-run")]).json()
    (verdict,) = test["step_time_tests"]
    assert "Step time vs first run" in table and catalogue(server)["tflops_useful"]["label"] in table
    assert f"last {verdict['n']} vs {verdict['n_baseline']} intervals" in table
    assert ("different" if verdict["p_value"] < 0.01 else "no clear difference") in table
    dashes = page.evaluate("document.querySelector('#chart-tflops .plot').data.map(t => t.line.dash)")
    assert dashes == ["solid", "dash", "solid", "dash"]
    page.screenshot(path=tmp_path / "compare_page.png", full_page=True)
    assert page.errors == []


def test_empty_run_draws_its_first_interval_live(server, page):
    body = {"run_id": "empty-run", "name": "waiting", "model": MODEL, "layout": "bshd"}
    assert httpx.post(f"{server}/api/v1/runs", json=body).status_code == 201
    page.goto(f"{server}/runs/empty-run")
    # The page's first load is over when it has said why MFU is missing (the card starts empty
    # in the markup, and plotly.js loads after the page's load event).
    until(page, "document.querySelector('#chart-mfu').innerText.includes('peak TFLOP/s')")
    assert page.evaluate("document.querySelector('#chart-tflops').classList.contains('is-empty')")
    assert "Waiting for the first interval" in page.inner_text("#chart-tflops")

    page.wait_for_selector("#live.on")
    post_intervals(server, "empty-run", range(2))
    page.wait_for_selector("#chart-tflops:not(.is-empty)", timeout=10_000)
    until(page, f"{LINES}.every(t => t.y.length === 2)")
    page.locator("#chart-histogram").scroll_into_view_if_needed()  # a panel out of view is brought up to date once seen
    page.wait_for_selector("#chart-histogram:not(.is-empty)")
    assert "peak TFLOP/s" in page.inner_text("#chart-mfu")  # still no peak, still explained
    assert page.errors == []


FORBIDDEN = ("Share", "Chart Studio", "Plotly Cloud", "sendDataToCloud", "editInChartStudio", "plotly.com", "plot.ly")


def test_no_page_uploads_or_leaves_the_server(server, page):
    """No modebar offers to send a chart anywhere, and no page requests a URL off this server."""
    requests = []
    page.on("request", lambda request: requests.append(request.url))
    for path in ("/", "/runs/live-run", "/runs/nvml-run", "/compare?run_id=live-run&run_id=other-run"):
        page.goto(server + path)
        page.wait_for_load_state("networkidle")
        if path.startswith("/runs/"):  # plotly.js runs after the first drawing; networkidle can come first
            drawn = "['tflops', 'loss', 'length_heatmap'].every(c => document.querySelector(`#chart-${c} .plot`).data)"
            until(page, drawn)
        for plot in page.query_selector_all(".chart:not(.is-empty) .plot"):
            plot.hover()  # the modebar is drawn on hover
            modebar = plot.eval_on_selector(".modebar", "bar => bar.outerHTML")
            assert not [word for word in FORBIDDEN if word in modebar], path
            assert plot.query_selector(".modebar-btn--logo, a[href^=http]") is None, path
        assert page.evaluate("() => window.PlotlyConfig?.showSendToCloud") is None
    assert requests and all(url.startswith(server + "/") for url in requests), [
        u for u in requests if not u.startswith(server)
    ]
    assert page.errors == []


def test_compare_names_unknown_ids_and_shows_the_rest(server, page):
    page.goto(f"{server}/compare?run_id=live-run&run_id=ghost-run&run_id=other-run")
    page.wait_for_selector("#unknown:not([hidden])")
    assert "ghost-run" in page.inner_text("#unknown")
    until(page, "document.querySelector('#chart-tflops .plot').data?.length === 4")
    assert page.is_hidden("#error")
    assert page.query_selector_all("#compare-table .placeholder") == []
    table = page.inner_text("#compare-table")
    assert "thd-live" in table and "thd-other" in table
    # The browser logs the expected 404s of the lookup; nothing else may fail.
    assert [e for e in page.errors if "404" not in e] == []


def test_compare_of_only_unknown_ids_says_so(server, page):
    page.goto(f"{server}/compare?run_id=ghost-run&run_id=phantom-run")
    page.wait_for_selector("#unknown:not([hidden])")
    assert "ghost-run" in page.inner_text("#unknown") and "phantom-run" in page.inner_text("#unknown")
    assert page.is_hidden("#compare-table-card") and page.is_hidden("#chart-tflops")


def test_finished_run_is_not_live(server, page):
    page.goto(f"{server}/runs/done-run")
    until(
        page,
        f"{LINES}?.length === 3".replace(
            "document.querySelector('#chart-tflops .plot').data.",
            "document.querySelector('#chart-tflops .plot').data?.",
        ),
    )
    page.wait_for_timeout(1000)  # time for a stream, had one been opened, to announce itself
    assert page.inner_text("#run-status") == "finished"
    assert "live" not in page.inner_text("#live") and page.query_selector("#live.on") is None


def test_zooming_one_chart_zooms_the_others_on_x(server, page):
    page.goto(f"{server}/runs/live-run")
    until(page, "['tflops', 'step_time', 'loss'].every(id => document.querySelector(`#chart-${id} .plot`).data)")
    page.evaluate("() => Plotly.relayout(document.querySelector('#chart-tflops .plot'), {'xaxis.range': [30, 70]})")
    ranges = (
        "['step_time', 'loss', 'padding'].map(id => document.querySelector(`#chart-${id} .plot`).layout.xaxis.range)"
    )
    until(page, f"{ranges}.every(r => r[0] === 30 && r[1] === 70)")
    page.evaluate("() => Plotly.relayout(document.querySelector('#chart-loss .plot'), {'xaxis.autorange': true})")
    until(page, "document.querySelector('#chart-tflops .plot').layout.xaxis.autorange === true")
    # The histogram's x is a length bucket, not the step: it stays out of the link.
    assert page.evaluate("() => document.querySelector('#chart-histogram .plot').layout.xaxis.type") == "category"
    assert page.errors == []


def test_labels_on_the_pages_are_the_catalogues(server, page):
    labels = {name: metric["label"] for name, metric in catalogue(server).items()}
    shown = (
        "() => [...document.querySelectorAll('[data-label-of]')].map(a => [a.dataset.labelOf, a.textContent, a.title])"
    )
    for path in ("/", "/runs/live-run", "/compare?run_id=live-run&run_id=other-run"):
        page.goto(server + path)
        page.wait_for_selector("[data-label-of]")
        found = page.evaluate(shown)
        assert found, path
        for name, text, title in found:
            assert text == labels[name] and title == catalogue(server)[name]["doc"], (path, name)
        # Every label links to its definition, rendered on the page from the catalogue.
        assert page.is_visible("#definitions")
        for name, _, _ in found:
            assert labels[name] in page.inner_text(f"#def-{name}")
    page.goto(f"{server}/runs/live-run")
    until(page, f"document.querySelector('#chart-tflops .plot').data && {LINES}.length === 3")
    assert sorted(name for name, _ in plotted(page).items()) == sorted(
        labels[f"tflops_{k}"] for k in ("bshd", "thd", "useful")
    )
    assert page.errors == []


def test_runs_list_leads_with_useful_tflops_in_the_catalogue_format(server, page):
    page.goto(server + "/")
    page.wait_for_selector("tr[data-run-id=live-run]")
    heads = page.eval_on_selector_all("#runs-table th[data-metric]", "ths => ths.map(th => th.dataset.metric)")
    assert heads[0] == "tflops_useful"
    cell = page.query_selector("tr[data-run-id=live-run] td.headline")
    assert cell.inner_text() == format(shown(server, "live-run"), "#.4g")  # d3 ".4g" keeps trailing zeros
    assert page.evaluate("(el) => getComputedStyle(el).fontWeight", cell) == "700"
    # MFU is a fraction, shown with the catalogue's ".1%".
    mfu = shown(server, "live-run", "mfu_useful")
    index = heads.index("mfu_useful")
    cells = page.eval_on_selector_all("tr[data-run-id=live-run] td.num", "tds => tds.map(td => td.textContent)")
    assert f"{100 * mfu:.1f}%" in cells[index + 1 :]  # after "Last step"


def test_formatter_honours_the_catalogues_specifiers(server, page):
    page.goto(server + "/")
    cases = [
        [".4g", 0.05, "0.05000"],
        [".4g", 123.456, "123.5"],
        [".4s", 1234567, "1.235M"],
        [".4s", 999.96, "1.000k"],
        [".1f", 12.345, "12.3"],
        [".1%", 0.4523, "45.2%"],
        [",d", 1234567.6, "1,234,568"],
        [".3g", -2.5, "−2.50"],
        [".3s", 3.2e-6, "3.20µ"],
        [".4g", None, "—"],
    ]
    got = page.evaluate(
        "async (cases) => { const f = await import('/static/format.js');"
        " return cases.map(([spec, x]) => f.formatNumber(spec, x)); }",
        cases,
    )
    assert got == [expected for _, _, expected in cases]


def test_system_panel_shows_only_with_nvml_readings(server, page):
    page.goto(f"{server}/runs/nvml-run")
    page.wait_for_selector("#system:not([hidden])")
    until(page, "['gpu_util', 'gpu_power', 'energy'].every(id => document.querySelector(`#chart-${id} .plot`).data)")
    for name in ("gpu_util_pct", "gpu_power_w", "energy_per_token_j"):
        assert page.inner_text(f"[data-stat={name}] .value") != "—"
    page.goto(f"{server}/runs/live-run")
    until(page, "document.querySelector('#chart-tflops .plot').data")
    assert page.is_hidden("#system")
    assert page.errors == []


def test_chart_corners_and_notes_read_right(server, page):
    """The y "0" and the first x tick do not overlap; no note promises bands that are not drawn."""
    page.goto(f"{server}/runs/nvml-run")  # two intervals: x ticks start at the origin's corner
    until(page, "document.querySelector('#chart-step_time .plot').data")
    boxes = page.evaluate("""() => [...document.querySelectorAll('.chart:not(.is-empty) .plot')].map(plot => {
        const box = (el) => { const r = el.getBoundingClientRect(); return [r.left, r.top, r.right, r.bottom]; };
        const y = [...plot.querySelectorAll('.ytick text')].map(box).sort((a, b) => b[1] - a[1])[0];
        const x = [...plot.querySelectorAll('.xtick text')].map(box).sort((a, b) => a[0] - b[0])[0];
        return [plot.parentElement.id, y, x];
    })""")
    assert len(boxes) >= 8
    for chart, y, x in boxes:
        if y and x:
            overlap = y[0] < x[2] and x[0] < y[2] and y[1] < x[3] and x[1] < y[3]
            assert not overlap, f"{chart}: y tick {y} overlaps x tick {x}"
    # One interval per point: the min-max bands have no width, so no note mentions them, and
    # plotly is not asked to draw them (they stay in the chart's traces, for its CSV).
    for chart in ("tflops", "step_time"):
        assert "shaded" not in page.inner_text(f"#chart-{chart} .note")
        bands = f"document.querySelector('#chart-{chart} .plot').data.filter(t => t.meta.kind === 'band')"
        shown = page.evaluate(f"{bands}.map(t => t.visible)")
        assert shown and set(shown) == {False}, (chart, shown)


def test_run_configuration_opens_under_the_charts(server, page):
    page.goto(f"{server}/runs/live-run")
    settings = page.locator("#run-settings")
    row = settings.locator("#settings-model tr").filter(has=page.locator("th code", has_text=re.compile("^layers$")))
    assert not row.is_visible()  # collapsed until asked for
    settings.locator("summary").click()
    assert row.is_visible()
    assert row.locator("td").inner_text() == str(MODEL["layers"])
    assert page.errors == []


def test_a_chart_csv_keeps_run_names_that_look_like_formulas_as_text(server, page):
    """A compare chart's traces are named after runs; a run named =HYPERLINK(...) must not become
    a formula in a spreadsheet (issue 22): text cells that start with =, +, -, @ get a leading '."""
    page.goto(server + "/")
    csv = page.evaluate(
        """async () => {
            const { tracesToCSV } = await import('/static/csv.js');
            return tracesToCSV([
                {name: '=HYPERLINK("http://x","y")', x: [1, 2], y: [-1.5, 2]},
                {name: '+cmd', x: [1], y: [3]},
                {name: 'plain', x: [2], y: [4]},
            ], 'step');
        }"""
    )
    header, first, second = csv.splitlines()
    assert header == 'step,"\'=HYPERLINK(""http://x"",""y"")",\'+cmd,plain'
    assert first == "1,-1.5,3," and second == "2,2,,4"  # numbers, negative ones too, stay numbers


def test_the_run_page_says_where_the_flops_go(server, page):
    """Attention's share of the per-document FLOPs as a tile, and split by layer kind where the
    model has sliding-window layers: the server's figures, as the page formats them."""
    page.goto(f"{server}/runs/window-run")
    until(page, "document.getElementById('flops-split').textContent !== ''")
    run = httpx.get(f"{server}/api/v1/runs/window-run").json()["steady"]
    assert 0 < run["attention_sliding_pct"] < run["attention_full_pct"]  # the window is shorter than the documents
    assert run["attention_share_pct"] == pytest.approx(run["attention_full_pct"] + run["attention_sliding_pct"])
    assert page.inner_text("[data-stat=attention_share_pct] .value") == f"{run['attention_share_pct']:.1f}%"
    assert page.inner_text("#flops-split") == (
        f"Of the per-document FLOPs, attention is {run['attention_share_pct']:.1f}% "
        f"(full attention {run['attention_full_pct']:.1f}%, "
        f"sliding-window attention {run['attention_sliding_pct']:.1f}%)."
    )
    page.goto(f"{server}/runs/live-run")  # full attention only: no split to show
    until(page, "document.getElementById('flops-split').textContent !== ''")
    share = shown(server, "live-run", "attention_share_pct")
    assert page.inner_text("#flops-split") == f"Of the per-document FLOPs, attention is {share:.1f}%."
    assert page.errors == []
