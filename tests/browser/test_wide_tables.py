"""The runs and compare tables use the window's width, in Debian's chromium against a real server of
200 runs: at 1600 px (and wider) the default columns (useful, THD-corrected and baseline TFLOP/s,
over-count, MFU, step time, syncs) show without scrolling sideways, 12 compared runs fit as a row
each; the column chooser and the grouping live in the URL; groups show their mean and min-max;
the compare page lists the settings in which runs differ and draws each group's mean and band.

With PACKSCOPE_SCREENSHOTS=1 the 1600x900 views are saved to docs/screenshots/."""

import os
import random
import statistics
from pathlib import Path
from urllib.parse import parse_qs, urlparse

import httpx
import pytest
from browser_support import run_body, running_server, until
from wire_records import packed_interval

pytestmark = pytest.mark.browser
SCREENSHOTS = Path(__file__).resolve().parents[2] / "docs" / "screenshots"
RUNS = 200
COMPARED = 12
DEFAULT_COLUMNS = [
    "tflops_useful",
    "tflops_thd",
    "tflops_bshd",
    "overcount_pct",
    "mfu_useful",
    "step_time_s",
    "syncs_per_iter",
]
LRS = (1e-4, 3e-4, 1e-3)
ROWS = "document.querySelectorAll('#runs-body tr[data-run-id]').length"


def sweep_run(i: int) -> dict:
    """A run of a realistic sweep: long names, a config that differs in lr, seed and layout."""
    layout = "thd" if i % 2 else "bshd"
    name = f"sft-llama3-8b-{layout}-pack4096-lr{LRS[i % 3]:.0e}-seed{i % 7}-run{i:03d}"
    config = {"optimizer": {"name": "adamw", "lr": LRS[i % 3], "betas": [0.9, 0.95]}, "seed": i % 7, "layout": layout}
    return run_body(
        f"{name}-20261201-{i:06x}",
        name,
        project="sft-sweep",
        layout=layout,
        tags=["h200", f"node{i % 4}"],
        config=config,
        started_at=f"2026-12-01T{i // 60:02d}:{i % 60:02d}:00Z",
    )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    rng = random.Random(0)
    with running_server(tmp_path_factory.mktemp("wide") / "wide.db") as base, httpx.Client(base_url=base) as client:
        for i in range(RUNS):
            body = sweep_run(i)
            assert client.post("/api/v1/runs", json=body).status_code == 201
            slow = 1 + 0.1 * (i % 3) + 0.05 * rng.random()
            count = 20 if i < COMPARED else 3
            records = [
                packed_interval(k, gpu_time_s=0.5 * slow * rng.uniform(0.97, 1.03), loss=2.0) for k in range(count)
            ]
            assert (
                client.post(f"/api/v1/runs/{body['run_id']}/intervals", json={"intervals": records}).status_code == 200
            )
        yield base


@pytest.fixture
def wide(sized_page):
    return sized_page


def overflow(page, selector: str) -> dict:
    return page.eval_on_selector(
        selector,
        """e => ({scroll: e.scrollWidth, client: e.clientWidth,
                  page: document.documentElement.scrollWidth, window: innerWidth})""",
    )


def assert_fits(page, selector: str) -> None:
    sizes = overflow(page, selector)
    assert sizes["scroll"] <= sizes["client"], sizes  # nothing to scroll sideways in the table...
    assert sizes["page"] <= sizes["window"], sizes  # ...nor in the page


def screenshot(page, name: str) -> None:
    if os.environ.get("PACKSCOPE_SCREENSHOTS"):
        SCREENSHOTS.mkdir(parents=True, exist_ok=True)
        page.screenshot(path=str(SCREENSHOTS / name))


def compare_url(server: str, extra: str = "") -> str:
    ids = [sweep_run(i)["run_id"] for i in range(COMPARED)]
    return f"{server}/compare?" + "&".join(f"run_id={i}" for i in ids) + extra


@pytest.mark.parametrize("width", [1600, 1920, 2560])
def test_the_runs_table_shows_the_default_columns_without_scrolling_sideways(server, wide, width):
    page = wide(width)
    page.goto(server)
    until(page, f"{ROWS} === 50")
    assert page.inner_text("#run-count") == f"{RUNS} runs"
    assert_fits(page, ".table-wrap")
    heads = page.eval_on_selector_all(
        "#runs-table th[data-metric]", "ths => ths.map(th => [th.dataset.metric, th.getBoundingClientRect().right])"
    )
    assert [name for name, _ in heads][: len(DEFAULT_COLUMNS)] == DEFAULT_COLUMNS
    assert all(right <= width for _, right in heads), heads  # on screen, every one
    if width == 1600:
        screenshot(page, "runs-table-200-runs-1600x900.png")


def test_the_column_chooser_is_kept_in_the_url(server, wide):
    page = wide(1600)
    page.goto(server)
    until(page, f"{ROWS} === 50")
    page.click("#column-chooser summary")
    page.uncheck("input[value=padding_pct]")
    page.check("input[value=gpu_util_pct]")
    heads = "[...document.querySelectorAll('#runs-table th[data-metric]')].map(th => th.dataset.metric).join()"
    until(page, f"{heads}.endsWith('real_tokens_per_gpu_s,gpu_util_pct')")
    cols = parse_qs(urlparse(page.url).query)["cols"][0].split(",")
    assert cols[: len(DEFAULT_COLUMNS)] == DEFAULT_COLUMNS and cols[-2:] == ["real_tokens_per_gpu_s", "gpu_util_pct"]
    assert "padding_pct" not in cols
    assert page.locator("tr[data-run-id] td.num").count() == 50 * (len(cols) + 1)  # + last step
    page.reload()
    until(page, f"{ROWS} === 50")
    until(page, f"{heads} === {','.join(cols)!r}")
    page.click("#column-chooser summary")
    page.click("#columns-default")
    until(page, f"{heads}.endsWith('padding_pct')")
    assert "cols" not in parse_qs(urlparse(page.url).query)


def test_runs_grouped_by_a_config_key_show_each_groups_mean_and_range(server, wide):
    page = wide(1600)
    page.goto(server)  # the newest 50 first: runs of every lr
    until(page, f"{ROWS} === 50")
    page.fill("#group-by", "optimizer.lr")
    page.press("#group-by", "Enter")
    until(page, "document.querySelectorAll('#runs-body tr.group-row').length === 3")
    assert parse_qs(urlparse(page.url).query)["group"] == ["config:optimizer.lr"]
    # The same page of runs, asked for with the key's values only.
    listed = httpx.get(f"{server}/api/v1/runs", params={"limit": 50, "config_keys": "optimizer.lr"}).json()["runs"]
    groups = page.eval_on_selector_all(
        "#runs-body tr.group-row",
        """rows => rows.map(r => [r.dataset.group, r.querySelector('.group-mean').textContent,
                                  r.querySelector('.group-label').textContent])""",
    )
    for label, mean_text, head in groups:
        members = [r for r in listed if str(r["config_values"]["optimizer.lr"]) == label]
        assert f"· {len(members)} of the 50 runs shown" in head
        rates = [r["steady"]["tflops_useful"] for r in members]
        assert mean_text == f"{statistics.mean(rates):.4g}"  # the catalogue's ".4g"
    rows_under = page.eval_on_selector_all("#runs-body tr", "rows => rows.map(r => r.className || r.dataset.runId)")
    assert rows_under[0] == "group-row" and len([r for r in rows_under if r != "group-row"]) == 50
    assert_fits(page, ".table-wrap")


def test_twelve_compared_runs_fit_as_a_row_each(server, wide):
    page = wide(1600)
    page.goto(compare_url(server))
    until(page, f"document.querySelectorAll('#compare-table tbody tr[data-run-id]').length === {COMPARED}")
    until(page, "document.querySelector('#chart-tflops .plot')?.data?.length > 0")
    assert_fits(page, "#compare-table-card")
    heads = page.eval_on_selector_all(
        "#compare-table thead th[data-metric]", "ths => ths.map(th => th.getBoundingClientRect().right)"
    )
    assert len(heads) == 11 and max(heads) <= 1600
    screenshot(page, "compare-12-runs-1600x900.png")


def test_the_compare_page_lists_the_settings_in_which_the_runs_differ(server, wide):
    page = wide(1600)
    page.goto(compare_url(server))
    until(page, "!document.getElementById('config-diff').hidden")
    keys = page.eval_on_selector_all("#config-diff-table tbody tr[data-key]", "rows => rows.map(r => r.dataset.key)")
    assert keys == ["layout", "optimizer.lr", "seed"]  # adamw, its betas, the model: the same in every run
    assert page.inner_text("#config-diff-note").startswith("3 settings differ; ")
    row = page.eval_on_selector(
        "#config-diff-table tr[data-key='optimizer.lr']", "r => [...r.cells].slice(1).map(c => c.textContent)"
    )
    assert row == [str(LRS[i % 3]) for i in range(COMPARED)]


def test_compared_runs_grouped_by_a_key_draw_each_groups_mean_and_band(server, wide):
    page = wide(1600)
    page.goto(compare_url(server, "&group=config:optimizer.lr"))
    until(page, "document.querySelector('#chart-step_time .plot')?.data?.length === 9")  # 3 groups x (band + mean)
    traces = page.eval_on_selector(
        "#chart-step_time .plot", "p => p.data.map(t => ({name: t.name, kind: t.meta.kind, x: t.x, y: t.y}))"
    )
    means = [t for t in traces if t["kind"] == "line"]
    assert sorted(t["name"] for t in means) == [f"optimizer.lr = {lr} (4 runs)" for lr in sorted(LRS, key=str)]
    assert "the mean of its runs at each step" in page.inner_text("#chart-step_time .note")
    series = {
        i: httpx.get(f"{server}/api/v1/runs/{sweep_run(i)['run_id']}/series").json()["columns"] for i in range(COMPARED)
    }
    for lr in LRS:
        mean = next(t for t in means if t["name"].startswith(f"optimizer.lr = {lr} "))
        members = [series[i] for i in range(COMPARED) if LRS[i % 3] == lr]
        step = mean["x"][5]
        values = [s["step_time_s"][s["step"].index(step)] for s in members]
        assert mean["y"][5] == pytest.approx(statistics.mean(values), rel=1e-12)
        edges = [t["y"][5] for t in traces if t["kind"] == "band" and t["name"].startswith(f"optimizer.lr = {lr} ")]
        assert edges == [pytest.approx(max(values)), pytest.approx(min(values))]  # the band: max edge, then min
