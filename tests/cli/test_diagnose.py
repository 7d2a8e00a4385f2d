"""`packscope diagnose RUN` and the ledger behind it, on two reference CPU runs of the same
documents: padded (BSHD, a document a row) and packed (THD), imported into a live server. The
padding term is worked out by hand from the run files' records."""

from __future__ import annotations

import pytest

from cli.support import get
from packscope.commands.cli import main
from packscope.core.flops import ModelSpec
from packscope.core.run_file import read_run_file


@pytest.fixture(scope="module")
def imported(trained, server: str) -> str:
    for layout in ("thd", "bshd"):
        assert main(["import", str(trained[layout]), "--server", server]) == 0
    return server


def run_id(trained, layout: str) -> str:
    return read_run_file(trained[layout]).run["run_id"]


def padding_share_by_hand(trained, layout: str) -> float:
    """(computed - useful) / computed FLOPs over the steady window (every interval but the first),
    from the records' raw sums: on BSHD the rows ran dense (attention over each whole row), on THD
    within each document."""
    run = read_run_file(trained[layout])
    spec = ModelSpec.from_dict(run.run["model"])
    steady = [r for r in run.records if r["interval"] > min(x["interval"] for x in run.records)]
    assert all(r["window_sq_sum_bshd"] == r["chunk_sq_sum_bshd"] == 0 for r in steady)  # full attention only
    tokens = sum(r["tokens"] for r in steady)
    real = sum(r["real_tokens"] for r in steady)
    s2 = sum(r["seqlen_sq_sum_bshd" if layout == "bshd" else "seqlen_sq_sum_thd"] for r in steady)
    s2_real = sum(r["seqlen_sq_sum_thd"] for r in steady)
    computed = tokens * spec.c_lin + s2 * spec.c_core
    return (computed - (real * spec.c_lin + s2_real * spec.c_core)) / computed


def test_padding_costs_more_step_time_padded_than_packed(imported, trained):
    """The packed run pads only its packs' tails (its records say so: tokens > real tokens), and
    there the padding runs the linear layers alone; the padded run pads every row and attends over
    it (tests/backend/test_ledger.py has full packs, where the term is a measured 0)."""
    shares = {}
    for layout in ("bshd", "thd"):
        ledger = get(imported, f"/api/v1/runs/{run_id(trained, layout)}/ledger")
        assert ledger["layout"] == layout and ledger["window"] == "steady"
        padding = next(t for t in ledger["terms"] if t["name"] == "padding")
        assert padding["status"] == "measured"
        share = padding_share_by_hand(trained, layout)
        assert padding["pct_of_step"] == pytest.approx(100 * share)
        assert padding["ms_per_step"] == pytest.approx(share * ledger["step_time_ms"])
        shares[layout] = share
        # A CPU: no peak, so neither the peak nor the useful work has a value, nor does the rest.
        by_name = {t["name"]: t for t in ledger["terms"]}
        for name in ("peak", "useful", "remainder", "data_wait", "launch_bound"):
            assert by_name[name]["status"] == "not measured" and by_name[name]["ms_per_step"] is None
        assert by_name["stragglers"]["status"] == "not applicable"
    assert shares["bshd"] > shares["thd"] > 0


def test_diagnose_prints_the_ledger_as_an_aligned_table(imported, trained, capsys):
    ledger = get(imported, f"/api/v1/runs/{run_id(trained, 'bshd')}/ledger")
    assert main(["diagnose", "cli-test-bshd", "--server", imported]) == 0  # the run by its name
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].startswith(f"run {ledger['run_id']}: steady window, steps {ledger['first_step']}-")
    header = next(i for i, line in enumerate(lines) if line.startswith("term "))
    table = lines[header : header + len(ledger["terms"]) + 2]  # the header, the terms and a rule
    padding = next(line for line in table if line.startswith("padding "))
    pad = next(t for t in ledger["terms"] if t["name"] == "padding")
    assert f"{pad['ms_per_step']:.4g}" in padding.split() and f"{pad['pct_of_step']:.1f}" in padding.split()
    assert table[1].startswith("padding ")  # the only measured loss, so the first
    # Every row's status starts in the header's "status" column.
    column = table[0].index("status")
    for line in table[1:]:
        if not line.startswith("-"):
            assert line[column:].split("  ")[0] in {"measured", "not measured", "n/a", "estimated"}, line
    assert any(line.startswith("hardware peak") and " - " in line for line in table)  # not measured: no 0
    assert "baseline over-count (a reporting error, not time):" in out


def test_diagnose_says_when_the_run_is_not_there(imported, capsys):
    assert main(["diagnose", "no-such-run-zzz", "--server", imported]) == 2
    assert "no run is stored" in capsys.readouterr().err
