"""The loss ledger on the pages (docs/ledger.md), in Debian's chromium against a real server: the
run page opens with it (the largest loss and its fix, the waterfall, every term priced or "not
measured", the over-count apart, the tiles it flags), the compare page puts two runs' ledgers
side by side with the predicted gain beside the realized one, and the runs list names each run's
largest loss; every figure is the ledger API's (tests/backend/test_ledger.py holds the API to an
independent computation), at 1280x800 and 1600x900."""

import httpx
import pytest
from browser_support import run_body, running_server, until
from wire_records import packed_interval

from packscope.core.catalogue import FIELDS

pytestmark = pytest.mark.browser
SIZES = [(1280, 800), (1600, 900)]
TERM_ROWS = "[...document.querySelectorAll('#ledger .ledger-table tbody tr')]"


def post(base, path, body, method="POST"):
    response = httpx.request(method, f"{base}{path}", json=body)
    assert response.status_code in (200, 201, 204), response.text
    return response


def intervals(base, run_id, ks, **kwargs):
    post(base, f"/api/v1/runs/{run_id}/intervals", {"intervals": [packed_interval(k, **kwargs) for k in ks]})


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_server(tmp_path_factory.mktemp("ledger") / "ledger.db") as base:
        # Before: half of each pack is padding, 40 syncs a step, 100 ms a step.
        post(base, "/api/v1/runs", run_body("before-run", "padded, syncing"))
        intervals(base, "before-run", range(4), docs_per_pack=4, doc_len=512, syncs_per_step=40, gpu_time_s=1.0)
        # After: full packs, no sync, 60 ms a step.
        post(base, "/api/v1/runs", run_body("after-run", "packed"))
        intervals(base, "after-run", range(4), docs_per_pack=8, doc_len=512, syncs_per_step=0, gpu_time_s=0.6)
        # A CPU run: no peak, so neither the peak nor the useful work nor the waterfall.
        cpu = run_body("cpu-run", "on a CPU")
        cpu["hardware"] = {"gpu_name": "cpu", "gpu_count": 1, "peak_tflops": None}
        post(base, "/api/v1/runs", cpu)
        intervals(base, "cpu-run", range(3), docs_per_pack=6, syncs_counted=False)
        # An old agent's records: without every field a record may leave out (the catalogue's
        # optional fields and those with a default), whatever fields later agents add.
        post(base, "/api/v1/runs", run_body("old-run", "an old agent"))
        post(base, "/api/v1/runs/old-run/intervals", {"intervals": [old_record(k) for k in range(3)]})
        yield base


def old_record(k: int) -> dict:
    record = packed_interval(k, docs_per_pack=6)
    for f in FIELDS:
        if f.required and f.default is None:
            continue
        holder = record
        for part in f.wire_path[:-1]:
            holder = holder.get(part) or {}
        holder.pop(f.wire_path[-1], None)
    return record


def ledger_of(server, run_id):
    return httpx.get(f"{server}/api/v1/runs/{run_id}/ledger").json()


def open_run(sized_page, server, run_id, size):
    page = sized_page(*size)
    page.goto(f"{server}/runs/{run_id}")
    until(page, f"{TERM_ROWS}.length > 0")
    return page


def shown_terms(page):
    return page.eval_on_selector_all(
        "#ledger .ledger-table tbody tr",
        """rows => rows.map(r => ({name: r.dataset.term,
            values: [...r.querySelectorAll('td')].slice(0, 3).map(c => c.dataset.value ?? null),
            texts: [...r.querySelectorAll('td')].slice(0, 3).map(c => c.textContent)}))""",
    )


def no_horizontal_scroll(page):
    return page.evaluate("document.documentElement.scrollWidth <= document.documentElement.clientWidth")


@pytest.mark.parametrize("size", SIZES)
def test_the_run_page_opens_with_the_ledger_priced_as_the_api_says(server, sized_page, size):
    page = open_run(sized_page, server, "before-run", size)
    api = ledger_of(server, "before-run")
    shown = shown_terms(page)
    assert [t["name"] for t in shown] == [t["name"] for t in api["terms"]]
    for row, term in zip(shown, api["terms"], strict=True):
        raw = [term["ms_per_step"], term["pct_of_step"], term["gpu_hours"]]
        if term["pct_of_step"] is None:
            assert row["texts"] == [term["status"]] and row["values"] == [None]  # never 0
        else:
            assert [float(v) for v in row["values"]] == [pytest.approx(v) for v in raw]
            assert (
                row["texts"][0] == f"{term['ms_per_step']:.2f} ms" and row["texts"][1] == f"{term['pct_of_step']:.1f}%"
            )
    # The lead: the largest loss the loop can remove, with its fix and its gain.
    padding = next(t for t in api["terms"] if t["name"] == "padding")
    losses = [t for t in api["terms"] if t["loss"] and t["name"] != "remainder" and t["pct_of_step"]]
    assert losses[0]["name"] == "padding"
    lead = page.inner_text("#ledger .ledger-lead")
    assert lead.startswith(f"Largest loss: padding, {padding['pct_of_step']:.1f}% of the step")
    assert f"What to change: {padding['fix']}." in lead
    after = api["step_time_ms"] - padding["ms_per_step"]
    assert f"If removed: step {api['step_time_ms']:.2f} ms → {after:.2f} ms" in lead
    # The syncs' code sites, from the term's detail.
    sites = next(t for t in api["terms"] if t["name"] == "host_syncs")["detail"]["sites"]
    assert sites == [{"site": "train.py:88", "per_iter": pytest.approx(40.0)}]
    assert page.inner_text("#ledger tr[data-term=host_syncs] .sites") == "at train.py:88 (40.0/iteration)"
    # Terms the ledger cannot price are listed as such, with what would measure them.
    unmeasured = page.inner_text("#ledger .ledger-unmeasured")
    assert unmeasured.startswith("Not measured (never shown as 0): ") and "host time between steps" in unmeasured
    # The over-count apart: a reporting error, not time.
    over = api["overcount"]["detail"]["overcount_pct"]
    assert page.inner_text("#ledger .ledger-overcount").startswith(
        f"Reporting error, not lost time: a baseline (dense BSHD-formula) logger would over-report this run's "
        f"TFLOP/s by {over:.1f}%."
    )
    # The waterfall: from the peak through each priced loss to the useful work.
    until(page, "document.querySelector('#ledger .ledger-plot').data[1].x.length > 2")
    bars = page.evaluate("document.querySelector('#ledger .ledger-plot').data[1].x")
    heights = page.evaluate("document.querySelector('#ledger .ledger-plot').data[1].y")
    priced = [t["label"] for t in api["terms"] if t["loss"] and t["pct_of_step"]]
    assert bars[0] == "hardware peak" and bars[-1] == "useful work" and bars[1 : 1 + len(priced)] == priced
    pcts = {t["label"]: t["pct_of_step"] for t in api["terms"] if t["pct_of_step"] is not None}
    assert [heights[bars.index(label)] for label in pcts] == [pytest.approx(v) for v in pcts.values()]
    # What the measured terms leave unexplained, apart: 100 - the priced losses - the useful work.
    if "not attributed" in bars:
        gap = 100 - sum(t["pct_of_step"] for t in api["terms"] if t["loss"] and t["pct_of_step"]) - pcts["useful work"]
        assert heights[bars.index("not attributed")] == pytest.approx(gap)
    assert no_horizontal_scroll(page)


def test_the_tiles_that_matter_are_flagged_and_the_others_are_not(server, sized_page):
    page = open_run(sized_page, server, "before-run", (1280, 800))
    until(page, "document.querySelector('[data-stat=syncs_per_iter].flagged') !== null")
    flagged = page.eval_on_selector_all("#totals .stat.flagged", "nodes => nodes.map(n => n.dataset.stat)")
    api = ledger_of(server, "before-run")
    syncs = next(t for t in api["terms"] if t["name"] == "host_syncs")["detail"]["syncs_per_iter"]
    assert syncs == pytest.approx(40.0)
    assert "syncs_per_iter" in flagged and "padding_pct" in flagged
    assert "steps" not in flagged and "tflops_useful" not in flagged
    assert page.inner_text("[data-stat=syncs_per_iter] .flag").startswith("40.0 host syncs per iteration")
    # A run without syncs and without padding: only its baseline's over-count is flagged.
    page.goto(f"{server}/runs/after-run")
    until(page, f"{TERM_ROWS}.length > 0")
    until(page, "document.querySelector('#totals .stat.flagged') !== null")
    assert page.eval_on_selector_all("#totals .stat.flagged", "n => n.map(x => x.dataset.stat)") == ["overcount_pct"]


def test_a_cpu_run_shows_not_measured_and_no_waterfall(server, sized_page):
    page = open_run(sized_page, server, "cpu-run", (1280, 800))
    api = ledger_of(server, "cpu-run")
    by_name = {t["name"]: t for t in api["terms"]}
    assert by_name["peak"]["pct_of_step"] is None and by_name["useful"]["pct_of_step"] is None
    rows = {t["name"]: t for t in shown_terms(page)}
    for name in ("peak", "useful", "host_syncs", "data_wait", "launch_bound", "remainder"):
        assert rows[name]["texts"] == ["not measured"] and rows[name]["values"] == [None]
    assert page.inner_text("#ledger .ledger-plot").startswith("No waterfall: the GPU's peak is not known")


@pytest.mark.parametrize("size", SIZES)
def test_the_runs_list_names_each_runs_largest_loss_and_fits_the_window(server, sized_page, size):
    page = sized_page(*size)
    page.goto(server)
    until(page, "document.querySelectorAll('#runs-body tr[data-run-id] td.largest-loss').length === 4")
    cells = page.eval_on_selector_all(
        "#runs-body tr[data-run-id]",
        """rows => Object.fromEntries(rows.map(r => { const c = r.querySelector('td.largest-loss');
            const d = c.dataset;
            return [r.dataset.runId, {term: d.term ?? null, value: d.value ?? null, text: c.textContent}]; }))""",
    )
    listed = {r["run_id"]: r["largest_loss"] for r in httpx.get(f"{server}/api/v1/runs").json()["runs"]}
    for run_id in ("before-run", "cpu-run", "old-run"):
        lead = next(t for t in ledger_of(server, run_id)["terms"] if t["loss"] and t["pct_of_step"])
        assert cells[run_id]["term"] == lead["name"] == listed[run_id]["name"] == "padding"
        assert float(cells[run_id]["value"]) == pytest.approx(lead["pct_of_step"])
        assert cells[run_id]["text"] == f"padding {lead['pct_of_step']:.1f}%"
    # Full packs, no syncs: no loss measured, shown as missing, never as a 0% loss.
    assert listed["after-run"] is None and cells["after-run"] == {"term": None, "value": None, "text": "—"}
    assert no_horizontal_scroll(page)


@pytest.mark.parametrize("size", SIZES)
def test_the_compare_page_puts_two_ledgers_side_by_side_with_predicted_and_realized_gains(server, sized_page, size):
    page = sized_page(*size)
    page.goto(f"{server}/compare?run_id=before-run&run_id=after-run")
    until(page, "document.querySelectorAll('#ledger-1 .ledger-table tbody tr').length > 0")
    before, after = ledger_of(server, "before-run"), ledger_of(server, "after-run")
    for i, ledger in enumerate((before, after)):
        shown = page.eval_on_selector_all(
            f"#ledger-{i} .ledger-table tbody tr",
            "rows => rows.map(r => [r.dataset.term, r.cells[2]?.dataset.value ?? null])",
        )
        expected = [[t["name"], t["pct_of_step"]] for t in ledger["terms"]]
        assert [name for name, _ in shown] == [name for name, _ in expected]
        assert [None if v is None else float(v) for _, v in shown] == [
            None if v is None else pytest.approx(v) for _, v in expected
        ]
    # The after run has no loss the loop removes above 0: it says so, and names what is not measured.
    assert page.inner_text("#ledger-1 .ledger-lead") == (
        "No loss the loop can remove was measured above 0 in this window. "
        "Not measured: host time between steps, host-/launch-bound steps, the rest (kernel efficiency)."
    )
    # Side by side: the two cards share a row.
    tops = page.eval_on_selector_all(".ledger-pair .ledger", "cards => cards.map(c => c.getBoundingClientRect().top)")
    assert len(tops) == 2 and tops[0] == pytest.approx(tops[1])
    # The after run packed its documents: the before's padding fell most, so it is the fix priced.
    padding = next(t for t in before["terms"] if t["name"] == "padding")
    fix = page.inner_text("#ledger-pair tr[data-row=fix] td")
    assert fix == f"padding: {padding['fix']}"
    predicted = page.get_attribute("#ledger-pair tr[data-row=predicted] td", "data-value")
    realized = page.get_attribute("#ledger-pair tr[data-row=realized] td", "data-value")
    assert float(predicted) == pytest.approx(padding["pct_of_step"])
    # By hand: 100 ms a step before, 60 after.
    assert float(realized) == pytest.approx(
        100 * (before["step_time_ms"] - after["step_time_ms"]) / before["step_time_ms"]
    )
    assert float(realized) == pytest.approx(40.0)
    assert page.inner_text("#ledger-pair tr[data-row=realized] td") == "40.0% of the step (100.00 ms → 60.00 ms)"
    assert no_horizontal_scroll(page)


def test_the_compare_page_shows_no_ledgers_for_three_runs(server, sized_page):
    page = sized_page(1280, 800)
    page.goto(f"{server}/compare?run_id=before-run&run_id=after-run&run_id=cpu-run")
    until(page, "document.querySelectorAll('#compare-table .run-head').length === 3")
    assert page.eval_on_selector("#ledgers", "e => e.hidden")


def test_an_old_record_shows_not_measured_for_what_it_lacks(server, sized_page):
    page = open_run(sized_page, server, "old-run", (1280, 800))
    api = ledger_of(server, "old-run")
    rows = {t["name"]: t for t in shown_terms(page)}
    unpriced = [t for t in api["terms"] if t["pct_of_step"] is None]
    assert {t["name"] for t in unpriced} >= {"data_wait", "launch_bound", "remainder"}
    for term in unpriced:
        assert rows[term["name"]]["texts"] == [term["status"]] and rows[term["name"]]["values"] == [None]
    for term in api["terms"]:
        if term["pct_of_step"] is not None:
            assert float(rows[term["name"]]["values"][1]) == pytest.approx(term["pct_of_step"])
