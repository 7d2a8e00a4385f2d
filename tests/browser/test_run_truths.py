"""What the run page and the runs table say about a run beside its numbers, in Debian's chromium
against a real server: whether its agent is still heard from (running, stale, crashed, running
again), the layout its batches had, which pack the baseline counted, refused intervals, the steps
each tile and table covers, and the charts of metrics the catalogue may add."""

import json
import threading

import httpx
import pytest
from browser_support import run_body, running_server, until
from wire_records import packed_interval

pytestmark = pytest.mark.browser
ROWS = "[...document.querySelectorAll('#runs-body tr[data-run-id]')].map(r => r.dataset.runId).join()"
# Stale after 9 s of silence, crashed after 30 s: the stale spell outlasts the page's 10 s poll.
BEAT_S = 3.0
CROSS_DETAIL = {
    "crossed": "GptOssForCausalLM with position_ids batches: packed documents attend to each other",
    "kept": "LlamaForCausalLM with position_ids batches: each packed document attends only to itself",
}


def post(base, path, body, method="POST"):
    response = httpx.request(method, f"{base}{path}", json=body)
    assert response.status_code in (200, 201, 204), response.text
    return response


def intervals(base, run_id, ks, **kwargs):
    post(base, f"/api/v1/runs/{run_id}/intervals", {"intervals": [packed_interval(k, **kwargs) for k in ks]})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("truths") / "truths.db") as base:
        # Declared THD, fed padded rows: the agent's PATCH says what the batches were.
        post(base, "/api/v1/runs", run_body("padded-run", "hf padded", layout="thd"))
        intervals(base, "padded-run", range(3))
        post(base, "/api/v1/runs/padded-run", {"layout": "bshd"}, "PATCH")
        # TRL packing: the baseline counts packs of max_length.
        post(base, "/api/v1/runs", run_body("trl-run", "trl packed"))
        intervals(base, "trl-run", range(3))
        trl = {"layout": "thd", "pack_length": 1024, "pack_length_from": "TRL max_length (packing=True)"}
        post(base, "/api/v1/runs/trl-run", trl, "PATCH")
        # The HF callback's cross-document check: documents attended to each other, and kept apart.
        for run_id, found in (("crossed-run", "crossed"), ("kept-run", "kept")):
            post(base, "/api/v1/runs", run_body(run_id, f"documents {found}"))
            intervals(base, run_id, range(2))
            patch = {"cross_documents": found, "cross_documents_detail": CROSS_DETAIL[found]}
            post(base, f"/api/v1/runs/{run_id}", patch, "PATCH")
        # Every interval refused by the agent, then the run finished.
        post(base, "/api/v1/runs", run_body("refused-run", "bad cu_seqlens"))
        reason = "cu_seqlens decreases (a boundary is smaller than the one before it) at 2 entries"
        refusals = [
            {"interval": k, "first_step": 10 * k + 1, "last_step": 10 * k + 10, "by": "agent", "reason": reason}
            for k in range(3)
        ]
        post(base, "/api/v1/runs/refused-run/refusals", {"refusals": refusals})
        post(base, "/api/v1/runs/refused-run", {"status": "finished"}, "PATCH")
        # A warm-up interval with many syncs: the steady window and the whole run differ.
        post(base, "/api/v1/runs", run_body("sync-run", "syncs"))
        intervals(base, "sync-run", [0], syncs_per_step=40)
        intervals(base, "sync-run", range(1, 12), syncs_per_step=1)
        # Syncs counted as the agent samples them by default: intervals 0, 1 and 9 of 0-11.
        post(base, "/api/v1/runs", run_body("sampled-run", "sampled syncs"))
        intervals(base, "sampled-run", [0], syncs_per_step=40)
        intervals(base, "sampled-run", [1, 9], syncs_per_step=1)
        intervals(base, "sampled-run", [2, 3, 4, 5, 6, 7, 8, 10, 11], syncs_counted=False)
        yield base


def beating(server, run_id, stop):
    """An agent's heartbeats, until `stop` is set: then the silence of a killed process."""
    while not stop.is_set():
        post(server, f"/api/v1/runs/{run_id}/heartbeat", {"every_s": BEAT_S})
        stop.wait(0.5)


def test_a_run_whose_agent_goes_silent_is_shown_stale_then_crashed_then_running_again(server, page):
    post(server, "/api/v1/runs", run_body("silent-run", "goes silent"))
    intervals(server, "silent-run", range(2))
    stop = threading.Event()
    agent = threading.Thread(target=beating, args=(server, "silent-run", stop), daemon=True)
    agent.start()
    try:
        page.goto(f"{server}/runs/silent-run")
        page.wait_for_selector("#live.on")
        assert page.inner_text("#run-status") == "running"
    finally:
        stop.set()
        agent.join()
    # Silence: no heartbeat, no record. The page polls the status and says since when.
    until(page, "document.getElementById('run-status').textContent === 'stale'", timeout=30_000)
    assert page.inner_text("#live").startswith("no contact since ")
    assert "live silent" in page.get_attribute("#live", "class")
    until(page, "document.getElementById('run-status').textContent === 'crashed'", timeout=45_000)
    assert page.inner_text("#live").startswith("no contact since ")
    # The runs table says the same, and its filter finds it.
    table = page.context.new_page()
    table.goto(f"{server}/?status=crashed")
    until(table, f"{ROWS} === 'silent-run'")
    cell = table.inner_text("tr[data-run-id='silent-run'] .status-cell")
    assert cell.startswith("crashed") and "heard " in cell and " ago" in cell
    table.close()
    # A record from a resumed agent: running again, live again.
    intervals(server, "silent-run", range(2, 4))
    post(server, "/api/v1/runs/silent-run/heartbeat", {"every_s": 30})
    until(page, "document.getElementById('run-status').textContent === 'running'", timeout=30_000)
    page.wait_for_selector("#live.on", timeout=30_000)


def test_the_layout_is_the_batches_and_says_what_was_declared(server, page):
    page.goto(f"{server}/runs/padded-run")
    until(page, "document.getElementById('run-layout').textContent.includes('bshd')")
    assert page.inner_text("#run-layout") == "layout bshd (as its batches were; declared thd)"
    page.goto(f"{server}/?layout=bshd")
    until(page, f"{ROWS} === 'padded-run'")
    assert page.inner_text("tr[data-run-id='padded-run'] td:nth-child(4)") == "bshd"
    assert page.input_value("#filter-layout") == "bshd"


def test_documents_that_attended_to_each_other_are_a_warning_and_kept_ones_a_note(server, page):
    page.goto(f"{server}/runs/crossed-run")
    until(page, "!document.getElementById('cross-documents').hidden")
    assert page.inner_text("#cross-documents") == (
        "Packed documents attend to each other: the model trains across document boundaries "
        f"({CROSS_DETAIL['crossed']}). Give it per-document masks (another batch form or attention "
        "implementation); meanwhile the per-document FLOPs count its whole-row attention, the work it did."
    )
    assert page.inner_text("#cross-documents-note") == ""
    page.goto(f"{server}/runs/kept-run")
    until(page, "document.getElementById('cross-documents-note').textContent !== ''")
    assert page.inner_text("#cross-documents-note") == (
        f"Packed documents stay apart: checked on a small copy of the model ({CROSS_DETAIL['kept']})."
    )
    assert page.is_hidden("#cross-documents")
    page.goto(f"{server}/runs/trl-run")  # no check reported: nothing said
    until(page, "document.getElementById('baseline-note').textContent.includes('Baseline')")
    assert page.is_hidden("#cross-documents") and page.inner_text("#cross-documents-note") == ""


def test_the_page_says_which_pack_the_baseline_counted(server, page):
    page.goto(f"{server}/runs/trl-run")
    until(page, "document.getElementById('baseline-note').textContent.includes('Baseline')")
    assert page.inner_text("#baseline-note") == (
        "Baseline: each pack counted as one dense sequence of 1,024 tokens (TRL max_length (packing=True)); "
        "a longer row the model ran counts as that many packs of it."
    )
    page.goto(f"{server}/runs/sync-run")
    until(page, "document.getElementById('baseline-note').textContent.includes('Baseline')")
    # packed_interval: one pack of 4096 token slots a step.
    assert page.inner_text("#baseline-note") == (
        "Baseline: each row the model ran counted as one dense sequence (on average 4,096 token slots a row)."
    )


def test_a_run_of_refused_intervals_says_why_instead_of_waiting(server, page):
    page.goto(f"{server}/runs/refused-run")
    page.wait_for_selector("#refused:not([hidden])")
    notice = page.inner_text("#refused")
    assert notice.startswith("3 intervals refused (steps 1–30): cu_seqlens decreases")
    assert "(3 by the agent)" in notice and "Nothing else was stored." in notice
    until(
        page, "document.querySelector('#chart-tflops .empty').textContent.startsWith('No interval stored: 3 intervals')"
    )
    text = page.inner_text("body")
    assert "Waiting for the first interval" not in text
    assert page.inner_text("#run-status") == "finished"
    page.goto(server)
    until(page, "document.querySelector('tr[data-run-id=\"refused-run\"] .status-refused') !== null")
    assert page.inner_text("tr[data-run-id='refused-run'] .status-refused") == "3 refused"


def test_every_tile_and_the_sync_table_say_the_steps_they_cover(server, page):
    page.goto(f"{server}/runs/sync-run")
    until(page, "document.querySelector('[data-stat=syncs_per_iter] .window').textContent !== ''")
    assert page.inner_text("[data-stat=syncs_per_iter] .window") == "steps 11–120"
    assert page.inner_text("[data-stat=steps] .window") == "steps 1–120"  # an amount: the whole run
    assert page.inner_text("#warmup-note").startswith(
        "Rates here cover steps 11–120: the first interval (steps 1–10: allocation, compilation, graph capture) "
        "is left out."
    )
    until(page, "document.getElementById('sync-sites-note').textContent.startsWith('steps')")
    assert page.inner_text("#sync-sites-note") == "steps 11–120, as the tiles: the first interval (warm-up) left out"
    tile = page.inner_text("[data-stat=syncs_per_iter] .value")
    rows = page.eval_on_selector_all(
        "#sync-sites-body tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
    )
    assert rows == [["train.py:88", "110", tile]]  # one site: its per-iteration count is the tile's
    run = httpx.get(f"{server}/api/v1/runs/sync-run").json()
    assert run["steady"]["syncs_per_iter"] == pytest.approx(1.0) and run["totals"]["syncs_per_iter"] > 4


def test_the_sync_table_says_what_share_of_its_steps_the_agent_counted(server, page):
    page.goto(f"{server}/runs/sampled-run")
    until(page, "document.getElementById('sync-sites-note').textContent.startsWith('steps')")
    assert page.inner_text("#sync-sites-note") == (
        "steps 11–120, as the tiles: the first interval (warm-up) left out; "
        "syncs counted on 18% of them (the agent samples intervals)"  # 20 of 110 steps
    )
    until(page, "document.querySelector('[data-stat=syncs_per_iter] .value').textContent !== ''")
    tile = page.inner_text("[data-stat=syncs_per_iter] .value")
    rows = page.eval_on_selector_all(
        "#sync-sites-body tr", "rows => rows.map(r => [...r.cells].map(c => c.textContent))"
    )
    # 20 syncs over the 20 counted steps: 1 a step, not 20 over 110.
    assert rows == [["train.py:88", "20", tile]] and tile.startswith("1.00")


def test_no_internal_note_on_a_run_without_channel_loss(server, page):
    page.goto(f"{server}/runs/sync-run")
    until(page, "document.querySelector('#chart-channels .empty').textContent.includes('per-channel')")
    assert page.inner_text("#chart-channels .empty") == (
        "This run reported no per-channel loss (step_end's channel_loss, docs/agent.md)."
    )
    assert "2026" not in page.inner_text("body") and "channel_tokens" not in page.inner_text("body")


OPTIONAL_METRICS = ("gpu_mem_used_bytes", "gpu_sm_clock_mhz", "step_time_p50_s", "step_time_p90_s")


def without_optional_metrics(page, server):
    """The catalogue as a server without the four metrics (before migration 0008) answers it."""
    catalogue = httpx.get(f"{server}/api/v1/catalogue").json()
    catalogue["metrics"] = [m for m in catalogue["metrics"] if m["name"] not in OPTIONAL_METRICS]
    body = json.dumps(catalogue)
    page.route(
        "**/api/v1/catalogue", lambda route: route.fulfill(status=200, content_type="application/json", body=body)
    )


def test_memory_clock_and_step_quantile_charts_come_from_the_catalogue(server, browser):
    names = {m["name"] for m in httpx.get(f"{server}/api/v1/catalogue").json()["metrics"]}
    assert set(OPTIONAL_METRICS) <= names
    post(server, "/api/v1/runs", run_body("nvml-run", "with telemetry"))
    records = [
        packed_interval(k, gpu_time_s=0.5 + 0.1 * k, gpu={"mem_used_bytes": 8e10 + 1e9 * k, "sm_clock_mhz": 1980.0 - k})
        for k in range(4)
    ]
    post(server, "/api/v1/runs/nvml-run/intervals", {"intervals": records})

    # A server whose catalogue lacks them: no cards, no quantile lines.
    plain = browser.new_page(viewport={"width": 1300, "height": 900})
    without_optional_metrics(plain, server)
    plain.goto(f"{server}/runs/nvml-run")
    until(plain, "document.querySelector('#chart-step_time .plot')?.data?.length > 0")
    until(plain, "!document.getElementById('system').hidden")
    assert plain.eval_on_selector("#chart-gpu_mem", "e => e.hidden") and plain.eval_on_selector(
        "#chart-gpu_clock", "e => e.hidden"
    )
    lines = plain.eval_on_selector("#chart-step_time .plot", "p => p.data.map(t => t.name)")
    assert not [n for n in lines if "p50" in n or "p90" in n]
    plain.close()

    # This server's catalogue has them: drawn from the series, one point per interval here.
    page = browser.new_page(viewport={"width": 1300, "height": 900})
    page.goto(f"{server}/runs/nvml-run")
    until(page, "document.querySelector('#chart-step_time .plot')?.data?.some(t => t.name === 'p90 step')")
    quantiles = page.eval_on_selector(
        "#chart-step_time .plot", "p => p.data.filter(t => /p50|p90/.test(t.name)).map(t => [t.name, t.y])"
    )
    steps = [r["step_time_p50_s"] for r in records]  # packed_interval: every step of an interval alike
    assert quantiles == [["median step (p50)", pytest.approx(steps)], ["p90 step", pytest.approx(steps)]]
    until(page, "document.querySelector('#chart-gpu_mem .plot')?.data?.[0]?.y?.length === 4")
    # Time-weighted means (Σ reading·s ÷ Σ s) of one interval each: the readings, to rounding.
    memory = page.eval_on_selector("#chart-gpu_mem .plot", "p => p.data[0].y")
    assert memory == pytest.approx([8e10 + 1e9 * k for k in range(4)], rel=1e-12)
    clock = page.eval_on_selector("#chart-gpu_clock .plot", "p => p.data[0].y")
    assert clock == pytest.approx([1980.0 - k for k in range(4)], rel=1e-12)
    assert not page.eval_on_selector("#chart-gpu_mem", "e => e.hidden")
    page.close()


def test_the_straggler_ticks_read_apart_and_the_slowest_ranks_are_the_dark_ones(server, page):
    post(server, "/api/v1/runs", run_body("ranked-run", "two ranks"))
    records = []
    for k in range(6):
        for rank, slow in ((0, 1.0), (1, 1.0 + 0.002 * k)):  # spreads 1.000 .. 1.010
            record = packed_interval(k, gpu_time_s=0.5 * slow)
            records.append({**record, "rank": rank})
    post(server, "/api/v1/runs/ranked-run/intervals", {"intervals": records})
    page.goto(f"{server}/runs/ranked-run")
    until(page, "!document.getElementById('ranks').hidden && document.querySelector('#chart-rank_spread .ytick')")
    ticks = page.eval_on_selector_all("#chart-rank_spread .ytick text", "ts => ts.map(t => t.textContent)")
    assert len(ticks) >= 3 and len(set(ticks)) == len(ticks), ticks
    # The heatmap's colour at each end of its scale: the fastest (lowest) end must be the light one.
    ends = page.eval_on_selector(
        "#chart-rank_heatmap .plot",
        """p => { const d = p._fullData[0]; const scale = d.reversescale ? [...d.colorscale].reverse() : d.colorscale;
                  return [scale[0][1], scale[scale.length - 1][1]]; }""",
    )

    def lightness(colour):
        r, g, b = (int(x) for x in colour[colour.index("(") + 1 : -1].split(",")[:3])
        return 0.2126 * r + 0.7152 * g + 0.0722 * b

    fastest, slowest = ends
    assert lightness(fastest) > lightness(slowest) + 100, ends


def test_past_64_ranks_the_panel_draws_the_ranks_quantiles_from_the_summaries(server, page):
    """70 ranks: no per-rank matrix in the answer; the panel draws the slowest, 90th percentile,
    median and fastest step time per interval, and names the latest interval's slowest ranks."""
    post(server, "/api/v1/runs", run_body("wide-run", "seventy ranks"))
    records = [
        {**packed_interval(k, gpu_time_s=0.5 * (1.0 + rank / 100 + (0.5 if rank == 33 else 0.0))), "rank": rank}
        for k in range(3)
        for rank in range(70)
    ]
    post(server, "/api/v1/runs/wide-run/intervals", {"intervals": records})
    page.goto(f"{server}/runs/wide-run")
    drawn = "document.querySelector('#chart-rank_heatmap .plot')?._fullData?.length"
    until(page, f"!document.getElementById('ranks').hidden && {drawn}")
    names = page.eval_on_selector("#chart-rank_heatmap .plot", "p => p._fullData.map(d => d.name)")
    assert names == ["slowest rank", "90th percentile", "median", "fastest rank"]
    slowest = page.eval_on_selector("#chart-rank_heatmap .plot", "p => p._fullData[0].y")
    steps = packed_interval(0)["steps"]
    assert slowest == pytest.approx([0.5 * 1.83 / steps] * 3)
    latest = page.inner_text("#ranks-latest")
    assert "rank 33 is slowest" in latest and "then ranks 69, 68, 67" in latest, latest


def test_a_one_rank_run_does_not_ask_for_the_ranks(server, page):
    asked = []
    page.on(
        "request", lambda request: asked.append(request.url) if "/api/v1/runs/sync-run/ranks" in request.url else None
    )
    page.goto(f"{server}/runs/sync-run")
    until(page, "document.querySelector('#chart-length_heatmap .plot')?._fullData?.[0]")
    assert page.eval_on_selector("#ranks", "e => e.hidden") and asked == []


def test_a_length_heatmap_of_whole_shares_uses_the_whole_scale(server, page):
    page.goto(f"{server}/runs/sync-run")  # one document length and one pack length: every cell 100%
    until(page, "document.querySelector('#chart-length_heatmap .plot')?._fullData?.[0]")
    zmin, zmax = page.eval_on_selector("#chart-length_heatmap .plot", "p => [p._fullData[0].zmin, p._fullData[0].zmax]")
    assert (zmin, zmax) == (0, 1)
    until(page, "document.querySelectorAll('#chart-length_heatmap .colorbar text').length > 1")
    labels = page.eval_on_selector_all("#chart-length_heatmap .colorbar text", "ts => ts.map(t => t.textContent)")
    assert "100%" in labels and not [label for label in labels if label in ("120%", "140%")], labels
