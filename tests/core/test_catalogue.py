"""The catalogue is the one definition of fields and metrics: check it against hand-computed values
and check that the server's schema, table and CSV are exactly what it says."""

import math

import msgspec
import pytest

from packscope.core.catalogue import FIELD, FIELDS, METRIC, METRICS, SUM_NAMES, Coefficients, derive, sums_of_rows
from packscope.core.flops import ModelSpec

# Two intervals of one run on 8 GPUs; every number below is worked out by hand from them.
ROWS = [
    {
        "rank": 0,
        "steps": 10,
        "gpus": 8,
        "gpu_time_s": 2.0,
        "host_time_s": 2.0,
        "tokens": 1000,
        "real_tokens": 900,
        "seqlen_sq_sum_bshd": 100_000,
        "seqlen_sq_sum_thd": 40_000,
        **{f.name: f.default for f in FIELDS if f.default is not None},  # fields added later: absent
        "documents": 30,
        "packs": 10,
        "syncs_total": 20,
        "step_time_p50_s": 0.19,
        "step_time_p90_s": 0.25,
        "loss": 2.0,
        "lr": 1e-3,
        "grad_norm": 0.8,
        "gpu_util_pct": 90.0,
        "gpu_power_w": 600.0,
        "gpu_sm_clock_mhz": 1980.0,
        "gpu_mem_used_bytes": 8e10,
        "gpu_energy_j": 900.0,
        "data_wait_s": 0.09,
        "data_wait_gaps": 9,
        "traced_steps": 3,
        "traced_step_time_s": 0.6,
        "traced_busy_s": 0.45,
        "sync_idle_s": 0.12,
        "launch_idle_s": 0.03,
        "traced_gaps": 2,
        "sync_idle_between_s": 0.02,
        "sync_blocked_s": 0.2,
        "sync_blocked_between_s": 0.01,
        "sync_loop_idle_s": 0.05,
        "sync_loop_blocked_s": 0.004,
        "expert_assignments": None,  # a model without zero-computation experts: no such field
    },
    {
        "rank": 0,
        "steps": 10,
        "gpus": 8,
        "gpu_time_s": 3.0,
        "host_time_s": 3.0,
        "tokens": 1000,
        "real_tokens": 600,
        "seqlen_sq_sum_bshd": 100_000,
        "seqlen_sq_sum_thd": 20_000,
        **{f.name: f.default for f in FIELDS if f.default is not None},  # fields added later: absent
        "documents": 20,
        "packs": 10,
        "syncs_total": 0,
        "step_time_p50_s": 0.29,
        "step_time_p90_s": 0.35,
        "loss": None,
        "lr": 5e-4,
        "grad_norm": None,
        "gpu_util_pct": 60.0,
        "gpu_power_w": None,
        "gpu_sm_clock_mhz": 1500.0,
        "gpu_mem_used_bytes": None,
        "gpu_energy_j": None,
        # An agent before the ledger's measurements: they weigh nothing.
        **dict.fromkeys(("data_wait_s", "data_wait_gaps", "traced_steps", "traced_step_time_s", "traced_busy_s"), None),
        "sync_idle_s": None,
        "launch_idle_s": None,
        "traced_gaps": None,
        "sync_idle_between_s": None,
        "sync_blocked_s": None,
        "sync_blocked_between_s": None,
        "sync_loop_idle_s": None,
        "sync_loop_blocked_s": None,
        "expert_assignments": None,
    },
]
C = Coefficients(c_lin=1_000_000, c_core=100, peak_tflops=1e-3)


def test_metrics_of_two_intervals_match_hand_computed_values():
    got = derive(sums_of_rows(ROWS), C)
    gpu_seconds = 2.0 * 8 + 3.0 * 8  # 40
    bshd = 2000 * 1e6 + 200_000 * 100  # 2.02e9
    thd = 2000 * 1e6 + 60_000 * 100  # 2.006e9
    useful = 1500 * 1e6 + 60_000 * 100  # 1.506e9
    assert got["flops_bshd"] == bshd and got["flops_thd"] == thd and got["flops_useful"] == useful
    assert got["tflops_bshd"] == pytest.approx(bshd / gpu_seconds / 1e12)
    assert got["tflops_useful"] == pytest.approx(useful / gpu_seconds / 1e12)
    assert got["mfu_thd"] == pytest.approx(thd / gpu_seconds / 1e12 / 1e-3)
    assert got["overcount_pct"] == pytest.approx(100 * (bshd / thd - 1))
    assert got["step_time_s"] == pytest.approx(5.0 / 20)
    assert got["tokens_per_gpu_s"] == pytest.approx(2000 / gpu_seconds)
    assert got["real_tokens_per_gpu_s"] == pytest.approx(1500 / gpu_seconds)
    assert got["padding_pct"] == pytest.approx(25.0)
    assert got["syncs_per_iter"] == pytest.approx(1.0)
    assert got["lr"] == pytest.approx((1e-3 * 10 + 5e-4 * 10) / 20)  # weighted by steps
    assert got["grad_norm"] == pytest.approx(0.8)  # the interval without a reading weighs nothing
    assert got["loss"] == pytest.approx(2.0)  # the interval without a loss carries no weight
    assert got["gpu_util_pct"] == pytest.approx((90 * 2 + 60 * 3) / 5)
    assert got["gpu_power_w"] == pytest.approx(600.0)
    assert got["energy_per_token_j"] == pytest.approx(900 / 900)
    assert got["step_time_p50_s"] == pytest.approx((0.19 * 10 + 0.29 * 10) / 20)
    assert got["step_time_p90_s"] == pytest.approx((0.25 * 10 + 0.35 * 10) / 20)
    assert got["gpu_sm_clock_mhz"] == pytest.approx((1980 * 2 + 1500 * 3) / 5)
    assert got["gpu_mem_used_bytes"] == pytest.approx(8e10)  # the interval without a reading carries no weight
    assert got["attention_share_pct"] == pytest.approx(100 * 60_000 * 100 / thd)
    assert got["steps"] == 20
    # The ledger's measurements, over the interval that carries them only.
    assert got["data_wait_step_s"] == pytest.approx(0.09 / 9)
    assert got["sync_idle_pct"] == pytest.approx(100 * 0.12 / 0.6)
    assert got["launch_idle_pct"] == pytest.approx(100 * 0.03 / 0.6)
    # The syncs' idle between the traced steps: its sums over the interval that split it only.
    sums = sums_of_rows(ROWS)
    assert (sums["traced_gaps"], sums["sync_idle_between_s"]) == (2, pytest.approx(0.02))


def test_steps_count_once_per_step_and_per_rank_means_divide_by_every_ranks_steps():
    """Two ranks ran the same 10 steps: 10 optimizer steps, not 20; step time and syncs per
    iteration are one rank's (Σ over ranks ÷ Σ steps over ranks), work adds over ranks."""
    rank_1 = [dict(ROWS[0], rank=1, gpu_time_s=4.0, syncs_total=40)]
    got = derive(sums_of_rows([ROWS[0], *rank_1]), C)
    assert got["steps"] == 10
    assert got["step_time_s"] == pytest.approx((2.0 + 4.0) / 20)
    assert got["syncs_per_iter"] == pytest.approx((20 + 40) / 20)
    assert got["tokens"] == 2000 and got["gpu_time_s"] == 6.0


def test_undefined_metrics_are_none_not_errors():
    empty = dict.fromkeys(SUM_NAMES, 0)
    got = derive(empty, Coefficients(c_lin=1, c_core=1, peak_tflops=None))
    assert got["tflops_thd"] is None and got["mfu_thd"] is None and got["overcount_pct"] is None
    assert got["loss"] is None and got["step_time_s"] is None


def test_a_window_derived_again_is_remembered_by_its_exact_sums():
    """derive remembers every metric of a window (the runs list derives each run's windows on
    every poll): found again, the values are those of a fresh evaluation, in a dict of its own,
    and sums that compare equal but differ in their bits (0.0 and -0.0) are not confused."""
    sums = sums_of_rows(ROWS)
    fresh = derive(sums, C, list(METRIC))  # the named path evaluates every time
    first, again = derive(sums, C), derive(sums, C)
    assert first == fresh and again == fresh and again is not first
    first["tflops_thd"] = -1.0  # a caller's change stays in its own dict
    assert derive(sums, C)["tflops_thd"] == fresh["tflops_thd"]
    signs = []
    for zero in (0.0, -0.0, 0.0):
        window = {**sums, "gpu_time_s": zero}
        expected = derive(window, C, ["step_time_s"])["step_time_s"]
        got = derive(window, C)["step_time_s"]
        assert got == expected == 0.0 and math.copysign(1.0, got) == math.copysign(1.0, expected)
        signs.append(math.copysign(1.0, got))
    assert signs == [1.0, -1.0, 1.0]


def test_mfu_needs_a_known_peak():
    assert derive(sums_of_rows(ROWS), Coefficients(1, 1, None))["mfu_useful"] is None


def test_coefficients_come_from_the_flops_model():
    spec = ModelSpec(layers=2, hidden=256, heads=4, ffn=1024, vocab=32000)
    c = Coefficients.for_run(spec.to_dict(), {"peak_tflops": 989.0})
    assert (c.c_lin, c.c_core, c.peak_tflops) == (spec.c_lin, spec.c_core, 989.0)


def test_every_metric_has_a_label_unit_format_and_definition():
    for m in METRIC.values():
        assert m.label and m.format and m.doc, m.name


def test_the_flops_labels_hold_in_both_layouts():
    """On a padded (BSHD) run the baseline is the dense work that ran: no label of the counts or
    of their gap may call it an error ("over-count") or name one layout ("THD-corrected")."""
    names = [f"{p}_{k}" for p in ("flops", "tflops", "mfu") for k in ("bshd", "thd", "useful")] + ["overcount_pct"]
    for name in names:
        label = METRIC[name].label.lower()
        assert "over" not in label and "thd" not in label and "bshd" not in label, (name, label)
    assert "padded run" in METRIC["overcount_pct"].doc and "packed one" in METRIC["overcount_pct"].doc


def test_the_server_schema_table_and_csv_are_the_catalogue():
    from packscope.backend.ingest.record import Record
    from packscope.backend.reads import csv_export
    from packscope.backend.store.models import intervals

    names = [f.name for f in FIELDS]
    assert [c.name for c in intervals.columns if c.name in names] == names
    assert set(intervals.columns.keys()) == {"id", "run_pk", "channel_loss", "channel_tokens", *names}
    top_level = {f.wire_path[0] for f in FIELDS}
    record_fields = {f.name for f in msgspec.structs.fields(Record)}
    assert top_level | {"histograms", "channel_loss", "channel_tokens"} == record_fields
    assert list(csv_export.CSV_COLUMNS[: len(names)]) == names


# The docs' tables of the catalogue, each between `<!-- catalogue:NAME -->` and
# `<!-- /catalogue:NAME -->`: a table that differs from what these functions make fails its test,
# which prints the table to put there.


def _fields_table() -> str:
    """docs/wire.md's table of the record's scalar fields, from the catalogue."""
    from packscope.core.catalogue import Field

    def number(x: float) -> str:
        return f"{int(x):,}" if float(x).is_integer() and abs(x) < 1e19 else f"{x:g}"

    def bounds(f: Field) -> str:
        lower = f"−{number(f.upper)}" if f.minimum is None else number(f.minimum)
        return f"{lower} … {number(f.upper)}"

    def presence(f: Field) -> str:
        if f.default is not None:
            return f"optional (absent: {f.default})"
        return "required" if f.required else "optional"

    lines = ["| wire path | type | unit | bounds | presence | meaning |", "|---|---|---|---|---|---|"]
    lines += [
        f"| `{'.'.join(f.wire_path)}` | {f.kind} | {f.unit} | {bounds(f)} | {presence(f)} | {f.doc} |" for f in FIELDS
    ]
    return "\n".join(lines)


def _metrics_table() -> str:
    """docs/api.md's table of the derived metrics (totals, steady, series, sort keys), from the catalogue."""
    lines = ["| metric | label | unit | band | meaning |", "|---|---|---|---|---|"]
    lines += [
        f"| `{m.name}` | {m.label} | {m.unit} | {'`_min`, `_max`' if m.band else ''} | {m.doc} |" for m in METRICS
    ]
    return "\n".join(lines)


def _csv_columns_table() -> str:
    """docs/api.md's table of the CSV's columns, in the header's order (CSV_COLUMNS, which the
    export writes as its header: tests/backend/test_csv_export.py)."""
    from packscope.backend.reads.csv_export import CSV_COLUMNS

    def source(name: str) -> tuple[str, str]:
        if name in FIELD:
            return FIELD[name].unit, f"the record's `{'.'.join(FIELD[name].wire_path)}`"
        if name in METRIC:
            return METRIC[name].unit, "the metric of that one interval"
        return "", f"the record's `{name}`, as its stored JSON text"

    lines = ["| column | unit | what |", "|---|---|---|"]
    lines += [f"| `{name}` | {unit} | {what} |" for name, (unit, what) in ((n, source(n)) for n in CSV_COLUMNS)]
    return "\n".join(lines)


def _shown(doc: str, name: str) -> str:
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / doc).read_text()
    start, end = f"<!-- catalogue:{name} -->\n", f"<!-- /catalogue:{name} -->"
    assert start in text and end in text, f"docs/{doc} has no {name} table between {start.strip()} and {end}"
    return text[text.index(start) + len(start) : text.index(end)].strip()


@pytest.mark.parametrize(
    ("doc", "name", "table"),
    [
        ("wire.md", "fields", _fields_table),
        ("api.md", "metrics", _metrics_table),
        ("api.md", "csv-columns", _csv_columns_table),
    ],
)
def test_the_docs_tables_are_the_catalogues(doc, name, table):
    expected = table()
    assert _shown(doc, name) == expected, f"docs/{doc}'s {name} table is stale; put this there:\n{expected}"


def test_the_syncs_loop_sums_count_only_the_rows_that_carry_them():
    # Only the first row split its sync idle into loops: the second's traced steps (an agent
    # before the split) must not dilute the loops' share of the traced time.
    rows = [
        dict(ROWS[0]),
        dict(ROWS[1], traced_steps=2, traced_step_time_s=0.4, traced_busy_s=0.3, sync_idle_s=0.1, launch_idle_s=0.0),
    ]
    sums = sums_of_rows(rows)
    assert (sums["traced_steps"], sums["loop_traced_steps"]) == (5, 3)
    assert sums["loop_traced_step_time_s"] == pytest.approx(0.6)
    assert (sums["sync_loop_idle_s"], sums["sync_loop_blocked_s"]) == (pytest.approx(0.05), pytest.approx(0.004))
