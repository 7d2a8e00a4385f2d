"""The pages stay readable when crowded, in Debian's chromium against a real server: 12 compared
runs and a grouped runs list at 1280x800 and 1600x900 scroll nowhere sideways; the compare charts
keep one legend entry (or none) per run, distinct colours and a plot of a useful height; rows of
many tags stay one line; the learning rate and gradient norm are charted; GPU memory ticks, tiny
rates and unknown ids read right."""

import functools
import re

import httpx
import pytest
from browser_support import run_body, running_server, until
from wire_records import packed_interval

pytestmark = pytest.mark.browser

COMPARED = 12
VIEWPORTS = [(1280, 800), (1600, 900)]
TAGS = ["h200", "sft", "llama3", "ablation", "pack4096", "nightly"]
LRS = (1e-4, 3e-4, 1e-3)
ROWS = "document.querySelectorAll('#runs-body tr[data-run-id]').length"
GIB50 = 50e9


def sweep_run(i: int) -> dict:
    layout = "thd" if i % 2 else "bshd"
    name = f"sft-llama3-8b-{layout}-pack4096-lr{LRS[i % 3]:.0e}-seed{i % 7}-run{i:03d}"
    run_id = f"{name}-20261201-{i:06x}"
    # The trainer's config carries the run's own name and id: they differ in every run by nature.
    config = {"name": name, "run_id": run_id, "optimizer": {"lr": LRS[i % 3]}, "seed": i % 7}
    return run_body(run_id, name, project="sft-sweep", layout=layout, tags=TAGS, config=config)


def record(k: int, i: int) -> dict:
    r = packed_interval(k, gpu_time_s=0.5 * (1 + 0.05 * i), loss=3.0 - 0.1 * k, gpu={"mem_used_bytes": GIB50})
    r["lr"] = LRS[i % 3] * (k + 1) / 10
    r["grad_norm"] = 1.0 + 0.1 * k
    return r


IDS = [sweep_run(i)["run_id"] for i in range(COMPARED)]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with (
        running_server(tmp_path_factory.mktemp("crowded") / "crowded.db") as base,
        httpx.Client(base_url=base) as client,
    ):
        for i in range(COMPARED):
            body = sweep_run(i)
            assert client.post("/api/v1/runs", json=body).status_code == 201
            records = [record(k, i) for k in range(8)]
            assert (
                client.post(f"/api/v1/runs/{body['run_id']}/intervals", json={"intervals": records}).status_code == 200
            )
        # A CPU run: some 65 MFLOP/s, 6.5e-5 TFLOP/s.
        assert client.post("/api/v1/runs", json=run_body("cpu-run", "cpu")).status_code == 201
        slow = [packed_interval(k, gpu_time_s=1.2e5) for k in range(3)]
        assert client.post("/api/v1/runs/cpu-run/intervals", json={"intervals": slow}).status_code == 200
        yield base


@pytest.fixture
def at(sized_page):
    """Pages of a viewport; a compare of a missing run answers 404 on purpose."""
    return functools.partial(sized_page, allow=("404",))


def compare_url(server: str, ids=IDS) -> str:
    return f"{server}/compare?" + "&".join(f"run_id={i}" for i in ids)


def no_sideways_scroll(page) -> None:
    sizes = page.evaluate("() => [document.scrollingElement.scrollWidth, document.scrollingElement.clientWidth]")
    assert sizes[0] <= sizes[1], sizes


def table_fits(page) -> None:
    """The runs table scrolls nowhere sideways inside its card either."""
    sizes = page.eval_on_selector(".table-wrap", "e => [e.scrollWidth, e.clientWidth]")
    assert sizes[0] <= sizes[1], sizes


def on_screen(page, selector: str) -> None:
    """Every element of `selector` lies within the window, none cut off on the right."""
    rights = page.eval_on_selector_all(selector, "els => els.map(e => e.getBoundingClientRect().right)")
    width = page.evaluate("() => document.documentElement.clientWidth")
    assert rights and max(rights) <= width, (rights, width)


@pytest.mark.parametrize("width,height", VIEWPORTS)
def test_the_grouped_runs_list_fits_the_window(server, at, width, height):
    page = at(width, height)
    page.goto(f"{server}/?group=layout")
    until(page, f"{ROWS} === {COMPARED + 1}")
    until(page, "document.querySelectorAll('#runs-body tr.group-row').length === 2")
    no_sideways_scroll(page)
    table_fits(page)
    on_screen(page, "#runs-body tr[data-run-id] td:last-child, #runs-table thead th")
    page.goto(server)
    until(page, f"{ROWS} === {COMPARED + 1}")
    no_sideways_scroll(page)
    table_fits(page)
    on_screen(page, "#runs-body tr[data-run-id] td:last-child")


def test_a_runs_actions_are_one_compact_menu(server, at):
    page = at(1280, 800)
    page.goto(server)
    until(page, f"{ROWS} === {COMPARED + 1}")
    cell = page.locator("tr[data-run-id=cpu-run] td.row-actions")
    assert cell.bounding_box()["width"] <= 60
    assert not page.get_by_label("delete cpu-run").is_visible()
    page.get_by_label("actions of cpu-run").click()
    for label in ("edit tags and notes of cpu-run", "archive cpu-run", "delete cpu-run"):
        assert page.get_by_label(label).is_visible()
    page.keyboard.press("Escape")
    assert not page.get_by_label("delete cpu-run").is_visible()


def test_tags_stay_on_one_line_with_the_rest_counted(server, at):
    page = at(1280, 800)
    page.goto(server)
    until(page, f"{ROWS} === {COMPARED + 1}")
    row = f"tr[data-run-id='{IDS[0]}']"
    tags = page.locator(f"{row} .tags")
    chips = tags.locator(".badge")
    tops = {round(chips.nth(i).bounding_box()["y"]) for i in range(chips.count())}
    assert len(tops) == 1  # one line
    more = tags.locator(".more-tags")
    hidden = int(more.inner_text().lstrip("+"))
    assert hidden > 0 and chips.count() - 1 + hidden == len(TAGS)
    assert all(tag in more.get_attribute("title") for tag in TAGS[-hidden:])
    # A dozen runs and more fit a 800 px window's height, not six.
    heights = page.eval_on_selector_all(
        "#runs-body tr[data-run-id]", "rs => rs.map(r => r.getBoundingClientRect().height)"
    )
    assert max(heights) <= 64, heights


@pytest.mark.parametrize("width,height", VIEWPORTS)
def test_twelve_compared_runs_fit_the_window(server, at, width, height):
    page = at(width, height)
    page.goto(compare_url(server))
    until(page, f"document.querySelectorAll('#compare-table tbody tr[data-run-id]').length === {COMPARED}")
    until(page, "document.querySelector('#chart-tflops .plot')?.data?.length > 0")
    no_sideways_scroll(page)


def test_the_tflops_chart_stays_readable_with_twelve_runs(server, at):
    page = at(1280, 800)
    page.goto(compare_url(server))
    until(page, "document.querySelector('#chart-tflops .plot')?.data?.length > 0")
    chart = page.evaluate("""() => {
        const plot = document.querySelector('#chart-tflops .plot');
        const legend = plot._fullLayout.showlegend ? plot.data.filter(t => t.showlegend !== false).length : 0;
        return {legend, height: plot._fullLayout._size.h, traces: plot.data.length,
                colors: plot.data.map(t => t.line.color)};
    }""")
    assert chart["height"] >= 200, chart
    assert chart["legend"] <= COMPARED, chart
    assert len(set(chart["colors"])) == COMPARED, chart  # one colour each, none repeated
    # The run key names every run once, in its chart colour.
    key = page.eval_on_selector_all("#run-key .run-key-item", "items => items.map(i => i.textContent)")
    assert len(key) == COMPARED
    # The other count is a choice, drawn dashed in the same colour, without a second legend entry.
    page.select_option("#tflops-measure", "both")
    until(page, f"document.querySelector('#chart-tflops .plot').data.length === {2 * COMPARED}")
    dashed = page.evaluate(
        "() => document.querySelector('#chart-tflops .plot').data.filter(t => t.line.dash === 'dash').length"
    )
    assert dashed == COMPARED
    legend = page.evaluate("""() => { const p = document.querySelector('#chart-tflops .plot');
        return p._fullLayout.showlegend ? p.data.filter(t => t.showlegend !== false).length : 0; }""")
    assert legend <= COMPARED
    assert "measure=both" in page.url


def test_a_run_key_entry_hides_that_run_in_every_chart(server, at):
    page = at(1600, 900)
    page.goto(compare_url(server, IDS[:3]))
    until(page, "document.querySelector('#chart-step_time .plot')?.data?.length === 3")
    page.click("#run-key .run-key-item >> nth=1")
    visible = """id => document.querySelector(`#chart-${id} .plot`).data.map(t => t.visible ?? true)"""
    until(page, f"({visible})('step_time').join() === 'true,legendonly,true'")
    assert page.evaluate(f"() => ({visible})('tflops').filter(v => v === 'legendonly').length") >= 1


def test_how_the_runs_differ_leaves_out_their_names_and_ids(server, at):
    page = at(1600, 900)
    page.goto(compare_url(server))
    until(page, "!document.getElementById('config-diff').hidden")
    keys = page.eval_on_selector_all("#config-diff-table tbody tr[data-key]", "rows => rows.map(r => r.dataset.key)")
    assert keys == ["optimizer.lr", "seed"]


def test_compare_counts_only_the_runs_found(server, at):
    page = at(1280, 800)
    page.goto(compare_url(server, [IDS[0], "ghost-run"]))
    page.wait_for_selector("#unknown:not([hidden])")
    until(page, "document.querySelector('h1').textContent.trim() === 'Compare 1 run'")
    assert "ghost-run" in page.inner_text("#unknown")


def test_gpu_memory_ticks_put_the_prefix_on_the_unit(server, at):
    page = at(1280, 800)
    page.goto(f"{server}/runs/{IDS[0]}")
    until(page, "document.querySelector('#chart-gpu_mem .plot')?.data")
    ticks = page.eval_on_selector_all("#chart-gpu_mem .ytick text", "ts => ts.map(t => t.textContent)")
    assert "50 GB" in ticks, ticks
    assert all(re.fullmatch(r"\d+(\.\d+)? [kMGT]?B", t) for t in ticks), ticks


def test_tiny_rates_read_in_a_smaller_unit(server, at):
    page = at(1280, 800)
    page.goto(f"{server}/runs/cpu-run")
    until(page, "document.querySelector('[data-stat=tflops_useful] .value').textContent !== '—'")
    text = page.inner_text("[data-stat=tflops_useful] .value")
    assert re.fullmatch(r"\d{1,3}(\.\d+)? [MG]FLOP/s", text), text
    formatted = page.evaluate(
        "async () => { const f = await import('/static/format.js');"
        " const m = {name: 'tflops_useful', label: 'useful TFLOP/s/GPU', unit: 'TFLOP/s', format: '.4g'};"
        " return [f.display(m, 6.516e-5), f.display(m, 0.5), f.display(m, 412.3)]; }"
    )
    assert formatted == ["65.16 MFLOP/s", "500.0 GFLOP/s", "412.3"]


def test_learning_rate_and_gradient_norm_are_charted(server, at):
    page = at(1280, 800)
    page.goto(f"{server}/runs/{IDS[2]}")
    for chart, values in (
        ("lr", [LRS[2] * (k + 1) / 10 for k in range(8)]),
        ("grad_norm", [1.0 + 0.1 * k for k in range(8)]),
    ):
        until(page, f"document.querySelector('#chart-{chart} .plot')?.data?.length > 0")
        y = page.evaluate(
            f"() => document.querySelector('#chart-{chart} .plot').data.find(t => t.meta.kind === 'line').y"
        )
        assert y == pytest.approx(values)
    page.goto(compare_url(server, IDS[:2]))
    until(page, "document.querySelector('.overlay-metric')?.options.length > 0")
    options = page.eval_on_selector(".overlay-metric", "s => [...s.options].map(o => o.value)")
    assert "lr" in options and "grad_norm" in options
