"""The runs list's largest loss (docs/ledger.md, "In the runs list"): from the run-level sums the
list already reads, equal to the ledger API's largest priced loss that the loop removes, and to
the padding worked out by hand; null (never a 0 loss) where none was measured."""

import pytest
from wire_records import packed_interval

from packscope.core.flops import ModelSpec

RUNS = "/api/v1/runs"
PACK, DOCS, DOC = 4096, 6, 512  # 1024 padding slots a pack


def post_run(client, new_run, run_id, intervals, **body):
    assert client.post(RUNS, json=new_run(run_id=run_id, parallel={"dp": 1}, **body)).status_code == 201
    if not intervals:
        return
    got = client.post(f"{RUNS}/{run_id}/intervals", json={"intervals": intervals}).json()
    assert got["accepted"] == len(intervals)


def listed(client) -> dict:
    return {r["run_id"]: r for r in client.get(RUNS).json()["runs"]}


def ledger_lead(client, run_id) -> dict | None:
    terms = client.get(f"{RUNS}/{run_id}/ledger").json()["terms"]
    priced = [t for t in terms if t["loss"] and t["name"] != "remainder" and t["pct_of_step"]]
    return priced[0] if priced else None


def test_the_list_names_the_ledgers_largest_loss_priced_by_hand(client, new_run, spec: ModelSpec):
    padded = [packed_interval(k, docs_per_pack=DOCS, doc_len=DOC, pack=PACK, gpu_time_s=1.0) for k in range(3)]
    post_run(client, new_run, "padded", padded)
    shown = listed(client)["padded"]["largest_loss"]
    lead = ledger_lead(client, "padded")
    assert shown["name"] == lead["name"] == "padding" and shown["fix"] == lead["fix"]
    assert shown["pct_of_step"] == pytest.approx(lead["pct_of_step"])
    assert shown["ms_per_step"] == pytest.approx(lead["ms_per_step"])
    # By hand: a packed layout's padding runs the linear layers only; 100 ms steps.
    computed = PACK * spec.c_lin + DOCS * DOC**2 * spec.c_core
    share = (PACK - DOCS * DOC) * spec.c_lin / computed
    assert shown["pct_of_step"] == pytest.approx(100 * share) and shown["ms_per_step"] == pytest.approx(100 * share)
    # The run page's summary carries the same.
    assert client.get(f"{RUNS}/padded").json()["largest_loss"] == shown


def test_no_loss_measured_is_null_not_a_zero_loss(client, new_run):
    full = [packed_interval(k, docs_per_pack=8, doc_len=512, pack=4096, syncs_per_step=0) for k in range(2)]
    post_run(client, new_run, "full", full)
    post_run(client, new_run, "empty", [])
    runs = listed(client)
    assert runs["full"]["largest_loss"] is None and ledger_lead(client, "full") is None
    assert runs["empty"]["largest_loss"] is None


def test_a_cpu_run_still_names_its_padding(client, new_run):
    """Padding needs no peak: the list names it where the MFU is not measured."""
    cpu = {"gpu_name": "cpu", "gpu_count": 1, "peak_tflops": None}
    padded = [packed_interval(k, docs_per_pack=DOCS, doc_len=DOC, pack=PACK, syncs_counted=False) for k in range(2)]
    post_run(client, new_run, "cpu", padded, hardware=cpu)
    shown = listed(client)["cpu"]["largest_loss"]
    assert shown["name"] == "padding" and shown["pct_of_step"] == pytest.approx(
        ledger_lead(client, "cpu")["pct_of_step"]
    )
