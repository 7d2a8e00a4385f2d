"""The dashboard's views in Debian's chromium against a real server: the per-channel loss chart,
every x axis (step, tokens seen, wall clock, relative time), the length heatmap and the interval
picker. Every plotted number is checked against a computation from the records posted here."""

import datetime
import re
from urllib.parse import parse_qs, urlparse
from zoneinfo import ZoneInfo

import httpx
import pytest
from browser_support import run_body, running_server, until
from wire_records import packed_interval

from packscope.core.histograms import EDGES, bucket_of

pytestmark = pytest.mark.browser

N = 12
START = 1_764_406_800.0  # unix seconds of the first interval's start
ZONE = "Asia/Kolkata"  # a zone with a half-hour offset: local time is not UTC shifted by whole hours
CHANNELS = ("code", "web")


def record(k):
    r = packed_interval(k, pack=4096 * (1 + k % 2), gpu_time_s=0.5 + 0.1 * (k % 3), loss=4.0 - 0.1 * k)
    r["wall_start"] = START + 61.5 * k
    r["wall_end"] = r["wall_start"] + 60.25
    r["channel_loss"] = {"code": 3.0 - 0.05 * k, "web": 3.5 + 0.02 * (k % 4)}
    if k % 5 != 3:  # every fifth interval comes from an older agent: means without tokens
        r["channel_tokens"] = {"code": 1000 + 100 * k, "web": 3000 - 50 * k}
    # Some short documents beside the packed ones, a different number each interval, so the
    # length shares change over the run.
    short = bucket_of(100)
    for part, n in (("count", k + 1), ("tokens", 100 * (k + 1))):
        r["histograms"]["documents"][part][short] += n
    return r


RECORDS = [record(k) for k in range(N)]
# A live run: a second channel starts with its fifth interval.
GROWING = [
    {
        **record(k),
        "channel_loss": {"code": 2.5 - 0.1 * k, **({"math": 4.0 - 0.2 * k} if k >= 4 else {})},
        "channel_tokens": {"code": 800, **({"math": 200 + k} if k >= 4 else {})},
    }
    for k in range(7)
]
# A second run for the compare page: only the code channel, every record with its tokens.
OTHER = [
    {**packed_interval(k, loss=3.0), "channel_loss": {"code": 2.0 + 0.1 * k}, "channel_tokens": {"code": 500}}
    for k in range(6)
]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("views") / "views.db", PACKSCOPE_STREAM_POLL_S="0.2") as base:
        assert httpx.post(f"{base}/api/v1/runs", json=run_body("views")).status_code == 201
        assert httpx.post(f"{base}/api/v1/runs/views/intervals", json={"intervals": RECORDS}).status_code == 200
        assert httpx.post(f"{base}/api/v1/runs", json=run_body("other")).status_code == 201
        assert httpx.post(f"{base}/api/v1/runs/other/intervals", json={"intervals": OTHER}).status_code == 200
        for run_id in ("views", "other"):
            assert httpx.patch(f"{base}/api/v1/runs/{run_id}", json={"status": "finished"}).status_code == 200
        assert httpx.post(f"{base}/api/v1/runs", json=run_body("growing")).status_code == 201  # stays running
        assert httpx.post(f"{base}/api/v1/runs/growing/intervals", json={"intervals": GROWING[:4]}).status_code == 200
        yield base


@pytest.fixture(scope="module")
def context(browser):
    context = browser.new_context(viewport={"width": 1300, "height": 900}, timezone_id=ZONE)
    yield context
    context.close()


def plot(chart):
    return f"document.querySelector('#{chart} .plot')"


def lines(chart):
    # No lines (not an error) while a reloaded page has no chart yet.
    return f"({plot(chart)}?.data || []).filter(t => t.meta.kind === 'line')"


def query(page):
    return parse_qs(urlparse(page.url).query)


def test_loss_per_channel_is_token_weighted_and_skips_means_without_tokens(server, page):
    page.goto(f"{server}/runs/views")
    until(page, f"{lines('chart-channels')}.length === 2")
    drawn = page.evaluate(
        f"{lines('chart-channels')}.map(t => ({{name: t.name, x: t.x, y: t.y, color: t.line.color}}))"
    )
    assert [t["name"] for t in drawn] == list(CHANNELS)
    assert drawn[0]["color"] != drawn[1]["color"]
    for trace in drawn:
        assert trace["x"] == [r["last_step"] for r in RECORDS]
        # One interval per point: the channel's mean where its tokens were sent, nothing elsewhere.
        want = [r["channel_loss"][trace["name"]] if "channel_tokens" in r else None for r in RECORDS]
        assert trace["y"] == [pytest.approx(w, rel=1e-12) if w is not None else None for w in want]


def test_channel_loss_of_a_coarse_point_is_the_token_weighted_mean(server, page):
    """Three intervals per point (max_points=4): Σ mean·tokens / Σ tokens over the ones with tokens."""
    answer = httpx.get(f"{server}/api/v1/runs/views/series", params={"max_points": 4}).json()
    for i, (first, last) in enumerate(
        zip(answer["columns"]["first_step"], answer["columns"]["last_step"], strict=True)
    ):
        inside = [r for r in RECORDS if first <= r["first_step"] and r["last_step"] <= last and "channel_tokens" in r]
        for channel in CHANNELS:
            weight = sum(r["channel_tokens"][channel] for r in inside)
            mean = sum(r["channel_loss"][channel] * r["channel_tokens"][channel] for r in inside) / weight
            assert answer["channel_loss"][channel][i] == pytest.approx(mean, rel=1e-12)


def hms(seconds):
    whole = round(seconds)
    return f"{whole // 3600}:{whole // 60 % 60:02d}:{whole % 60:02d}"


def loss_x(page):
    return page.evaluate(f"{lines('chart-loss')}[0].x")


def test_every_x_axis_and_the_url_keeps_it(server, page):
    page.goto(f"{server}/runs/views")
    until(page, f"{lines('chart-loss')}.length === 1")
    assert loss_x(page) == [r["last_step"] for r in RECORDS]

    page.select_option("#x-axis", "tokens")
    until(page, f"{plot('chart-loss')}.layout.xaxis.title.text.startsWith('tokens seen')")
    assert loss_x(page) == [sum(r["tokens"] for r in RECORDS[: k + 1]) for k in range(N)]

    page.select_option("#x-axis", "wall")
    until(page, f"{plot('chart-loss')}.layout.xaxis.type === 'date'")
    zone = ZoneInfo(ZONE)
    local = [
        datetime.datetime.fromtimestamp(r["wall_end"], zone).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] for r in RECORDS
    ]
    assert loss_x(page) == local

    page.select_option("#x-axis", "elapsed")
    until(page, f"{plot('chart-loss')}.layout.xaxis.tickmode === 'array'")
    elapsed = [r["wall_end"] - RECORDS[0]["wall_start"] for r in RECORDS]
    assert loss_x(page) == pytest.approx(elapsed, rel=1e-12)
    axis = page.evaluate(f"{plot('chart-loss')}.layout.xaxis")
    assert axis["tickvals"] and axis["ticktext"] == [hms(v) for v in axis["tickvals"]]
    assert min(axis["tickvals"]) >= 0 and max(axis["tickvals"]) <= max(elapsed)
    assert all(re.fullmatch(r"\d+:\d\d:\d\d", t) for t in axis["ticktext"])
    assert query(page)["x"] == ["elapsed"]

    # Zooming relabels the ticks for the range shown, on every linked chart.
    page.evaluate(f"Plotly.relayout({plot('chart-loss')}, {{'xaxis.range': [100, 160]}})")
    for chart in ("chart-loss", "chart-tflops"):
        until(page, f"{plot(chart)}.layout.xaxis.tickvals.every(v => v >= 100 && v <= 160)")
        zoomed = page.evaluate(f"{plot(chart)}.layout.xaxis")
        assert len(zoomed["tickvals"]) >= 3 and zoomed["ticktext"] == [hms(v) for v in zoomed["tickvals"]]

    page.reload()
    until(page, f"{plot('chart-loss')}.layout?.xaxis?.tickmode === 'array'")
    assert page.input_value("#x-axis") == "elapsed"
    assert loss_x(page) == pytest.approx(elapsed, rel=1e-12)


def shares(rows):
    return [[v / sum(row) if sum(row) else None for v in row] for row in rows]


def test_length_heatmap_shares_and_the_interval_picker(server, page):
    page.goto(f"{server}/runs/views")
    heat = f"{plot('chart-length_heatmap')}.data?.[0]"
    until(page, f"{heat}?.type === 'heatmap'")
    note = page.inner_text("#chart-length_heatmap .note")
    assert "each column is one interval" in note and f"all {N} intervals" in note
    for kind, part in (("documents", "count"), ("documents", "tokens"), ("packs", "tokens")):
        page.select_option("#heat-kind", kind)
        page.select_option("#heat-weight", part)
        until(page, f"{heat}.hovertemplate.includes('{'tokens in ' if part == 'tokens' else ''}{kind}')")
        drawn = page.evaluate(f"({{x: {heat}.x, y: {heat}.y, z: {heat}.z}})")
        assert drawn["x"] == [r["last_step"] for r in RECORDS]
        rows = [r["histograms"][kind][part] for r in RECORDS]
        used = [b for b in range(len(EDGES)) if any(row[b] for row in rows)]
        want = shares(rows)
        assert len(drawn["y"]) == used[-1] - used[0] + 1  # the buckets from the first used to the last
        for at, b in enumerate(range(used[0], used[-1] + 1)):
            assert drawn["z"][at] == pytest.approx([want[k][b] for k in range(N)], rel=1e-12)

    # The bars follow the latest interval until another is picked.
    bars = f"{plot('chart-histogram')}.data"
    until(page, f"document.getElementById('hist-picked').textContent.startsWith('interval {N - 1} ')")
    page.fill("#hist-interval", "4")
    until(page, "document.getElementById('hist-picked').textContent === 'interval 4 · steps 41–50'")
    drawn = page.evaluate(f"{bars}.map(t => ({{name: t.name, y: t.y}}))")
    documents = RECORDS[4]["histograms"]["documents"]["tokens"]
    want = documents[bucket_of(100) : bucket_of(4096) + 1]  # the used range: short documents to the packs
    assert next(t for t in drawn if t["name"] == "documents")["y"] == want

    # A click on a heatmap column picks its interval.
    area = page.locator("#chart-length_heatmap .nsewdrag").first
    area.scroll_into_view_if_needed()
    box = area.bounding_box()
    page.mouse.click(box["x"] + box["width"] * (7.5 / N) + 1, box["y"] + box["height"] / 2)
    until(page, "document.getElementById('hist-picked').textContent.startsWith('interval 7 ')")
    assert page.input_value("#hist-interval") == "7"


def test_compare_overlays_a_channels_loss(server, page):
    page.goto(f"{server}/compare?run_id=views&run_id=other")
    options = "[...document.querySelectorAll('#overlays .overlay-metric option')].map(o => o.value)"
    until(page, f"{options}.includes('channel_loss:web')")
    assert page.evaluate(options)[-2:] == ["channel_loss:code", "channel_loss:web"]
    page.select_option("#overlays .overlay-metric", "channel_loss:code")
    until(
        page,
        f"{lines('overlays')}.length === 2 && {lines('overlays')}.every(t => t.meta.column === 'channel_loss:code')",
    )
    drawn = {t["name"]: t["y"] for t in page.evaluate(f"{lines('overlays')}.map(t => ({{name: t.name, y: t.y}}))")}
    assert drawn["other"] == pytest.approx([r["channel_loss"]["code"] for r in OTHER], rel=1e-12)
    want = [r["channel_loss"]["code"] if "channel_tokens" in r else None for r in RECORDS]
    assert drawn["views"] == [pytest.approx(w, rel=1e-12) if w is not None else None for w in want]
    assert query(page)["metric"] == ["channel_loss:code"]
    page.select_option("#overlays .overlay-metric", "channel_loss:web")  # a channel only one run reports
    until(page, f"{lines('overlays')}.length === 1 && {lines('overlays')}[0].name === 'views'")
    page.reload()
    until(page, f"{lines('overlays')}.length === 1")
    assert page.input_value("#overlays .overlay-metric") == "channel_loss:web"


def test_live_intervals_extend_channels_time_axis_and_picker(server, page):
    page.goto(f"{server}/runs/growing?x=elapsed")
    until(page, f"{lines('chart-channels')}.length === 1")
    until(page, "document.getElementById('hist-picked').textContent.startsWith('interval 3 ')")
    page.wait_for_selector("#live.on")
    body = {"intervals": GROWING[4:]}
    assert httpx.post(f"{server}/api/v1/runs/growing/intervals", json=body).status_code == 200
    page.locator("#chart-channels").scroll_into_view_if_needed()  # a chart out of view is drawn once seen
    until(page, f"{lines('chart-channels')}.length === 2 && {lines('chart-channels')}.every(t => t.y.length === 7)")
    drawn = {
        t["name"]: t for t in page.evaluate(f"{lines('chart-channels')}.map(t => ({{name: t.name, x: t.x, y: t.y}}))")
    }
    assert drawn["code"]["y"] == pytest.approx([r["channel_loss"]["code"] for r in GROWING], rel=1e-12)
    # The new channel has no points before it started.
    assert drawn["math"]["y"][:4] == [None] * 4
    assert drawn["math"]["y"][4:] == pytest.approx([r["channel_loss"]["math"] for r in GROWING[4:]], rel=1e-12)
    elapsed = [r["wall_end"] - GROWING[0]["wall_start"] for r in GROWING]
    assert drawn["code"]["x"] == pytest.approx(elapsed, rel=1e-12)  # relative time continues from the run's start
    # The picker followed the latest interval, and its range grew (the lengths panel, like a
    # chart, is brought up to date once it is seen).
    page.locator("#chart-histogram").scroll_into_view_if_needed()
    until(page, "document.getElementById('hist-picked').textContent.startsWith('interval 6 ')")
    assert page.get_attribute("#hist-interval", "max") == "6"
