"""GET /api/v1/runs/{run_id}/ledger (docs/ledger.md): runs posted from the record builders, each
term checked against numbers worked out by hand from the records, and "not measured" (null,
never 0) wherever an input is missing."""

import pytest
from wire_records import packed_interval

from packscope.core.flops import ModelSpec
from packscope.core.ledger import ESTIMATED, MEASURED, NOT_MEASURED, Term, remainder_term

RUNS = "/api/v1/runs"
LEDGER = f"{RUNS}/run-1/ledger"
STEPS = 10  # packed_interval's steps per interval
PACK, DOCS, DOC = 4096, 6, 512  # 6 documents of 512 in a pack of 4096: 1024 padding slots a pack


def by_name(ledger: dict) -> dict:
    return {t["name"]: t for t in ledger["terms"]}


def post_ranks(client, step_s_by_rank: dict[int, float], intervals: int = 3, **record) -> None:
    batch = []
    for rank, step_s in step_s_by_rank.items():
        for k in range(intervals):
            r = packed_interval(k, docs_per_pack=DOCS, doc_len=DOC, pack=PACK, gpu_time_s=step_s * STEPS, **record)
            batch.append({**r, "rank": rank})
    assert client.post(f"{RUNS}/run-1/intervals", json={"intervals": batch}).json()["accepted"] == len(batch)


@pytest.fixture
def two_ranks(client, new_run):
    """Rank 0 steps in 50 ms, rank 1 in 150 ms, over 3 intervals of 10 steps."""
    assert client.post(RUNS, json=new_run(parallel={"dp": 2})).status_code == 201
    post_ranks(client, {0: 0.05, 1: 0.15})
    return client


def test_the_straggler_term_names_the_slow_rank_and_the_others_wait(two_ranks):
    got = two_ranks.get(LEDGER).json()
    assert got["window"] == "steady" and (got["first_step"], got["last_step"]) == (11, 30)  # interval 0 left out
    assert got["ranks"] == 2 and got["steps"] == 20
    # By hand: a rank's step is (50 + 150) / 2 = 100 ms; rank 0 waits 100 ms a step for rank 1,
    # rank 1 waits 0: 50 ms per rank-step, half the step; 2 ranks x 20 steps x 50 ms = 2 GPU-s.
    assert got["step_time_ms"] == pytest.approx(100.0)
    stragglers = by_name(got)["stragglers"]
    assert stragglers["status"] == MEASURED and stragglers["detail"]["slowest_rank"] == 1
    assert stragglers["ms_per_step"] == pytest.approx(50.0)
    assert stragglers["pct_of_step"] == pytest.approx(50.0)
    assert stragglers["gpu_hours"] == pytest.approx(2.0 / 3600)
    detail = stragglers["detail"]
    assert (detail["slowest_ms"], detail["mean_ms"], detail["intervals"]) == (
        pytest.approx(150.0),
        pytest.approx(100.0),
        2,
    )
    assert detail["slowest_rank_share"] == pytest.approx(1.0)


def test_the_straggler_term_is_each_intervals_slowest_rank_less_its_mean_brute_force(
    make_client, database_url, new_run
):
    """Four ranks whose slowest changes from interval to interval: the term is the mean over the
    steady window's intervals of (slowest - mean) step time, worked out here from the posted
    records themselves, and it names the rank behind most of that waiting (not the rank slowest
    on average)."""
    import random

    client = make_client(database_url)
    assert client.post(RUNS, json=new_run(parallel={"dp": 4})).status_code == 201
    rng = random.Random(7)
    times = {k: {rank: rng.uniform(0.04, 0.06) for rank in range(4)} for k in range(6)}
    for k in (1, 2, 3):
        times[k][2] = 0.2  # rank 2 straggles hard in three intervals
    for k in (4, 5):
        times[k][1] = 0.09  # rank 1 a little in two
    batch = [
        {**packed_interval(k, docs_per_pack=DOCS, doc_len=DOC, pack=PACK, gpu_time_s=t * STEPS), "rank": rank}
        for k, by_rank in times.items()
        for rank, t in by_rank.items()
    ]
    rng.shuffle(batch)
    assert client.post(f"{RUNS}/run-1/intervals", json={"intervals": batch}).json()["accepted"] == len(batch)
    steady = [times[k] for k in range(1, 6)]  # the first interval is warm-up
    wait = sum(max(t.values()) - sum(t.values()) / 4 for t in steady) / len(steady)
    step = sum(sum(t.values()) / 4 for t in steady) / len(steady)
    got = client.get(LEDGER).json()
    stragglers = by_name(got)["stragglers"]
    assert got["ranks"] == 4 and got["step_time_ms"] == pytest.approx(step * 1e3)
    assert stragglers["ms_per_step"] == pytest.approx(wait * 1e3)
    assert stragglers["pct_of_step"] == pytest.approx(100 * wait / step)
    assert stragglers["detail"]["slowest_rank"] == 2 and stragglers["detail"]["intervals"] == 5


def test_padding_syncs_peak_and_useful_by_hand(two_ranks, spec: ModelSpec):
    got = by_name(two_ranks.get(LEDGER).json())
    # Per pack: 4096 slots, 3072 real tokens, attention within 6 documents of 512 (packed: the
    # padding runs the linear layers only). The peak: 989 TFLOP/s x 4 GPU-seconds.
    computed = PACK * spec.c_lin + DOCS * DOC**2 * spec.c_core
    padding = (PACK - DOCS * DOC) * spec.c_lin
    assert got["padding"]["status"] == MEASURED
    assert got["padding"]["pct_of_step"] == pytest.approx(100 * padding / computed)
    assert got["padding"]["ms_per_step"] == pytest.approx(100.0 * padding / computed)
    assert got["padding"]["detail"]["padding_pct"] == pytest.approx(25.0)
    useful_per_step = 2 * (computed - padding)  # two ranks' packs a step
    assert got["useful"]["pct_of_step"] == pytest.approx(100 * useful_per_step / (989e12 * 2 * 0.1))
    assert got["peak"]["status"] == MEASURED and got["peak"]["ms_per_step"] == pytest.approx(100.0)
    assert got["peak"]["gpu_hours"] == pytest.approx(4.0 / 3600)
    # Syncs: 3 a step counted at one site; their time is not measured, so no value.
    syncs = got["host_syncs"]
    assert syncs["status"] == NOT_MEASURED and syncs["ms_per_step"] is None
    assert syncs["detail"]["syncs_per_iter"] == pytest.approx(3.0)
    assert syncs["detail"]["sites"] == [{"site": "train.py:88", "per_iter": pytest.approx(3.0)}]
    # The rest needs every loss measured: data wait, launch-bound and sync time are not.
    assert got["remainder"]["status"] == NOT_MEASURED and got["remainder"]["ms_per_step"] is None


def test_full_packs_have_a_measured_padding_of_0(client, new_run):
    assert client.post(RUNS, json=new_run(parallel={"dp": 1})).status_code == 201
    full = [packed_interval(k, docs_per_pack=8, doc_len=512, pack=4096) for k in range(2)]  # 8 x 512 = 4096
    assert client.post(f"{RUNS}/run-1/intervals", json={"intervals": full}).json()["accepted"] == 2
    padding = by_name(client.get(LEDGER).json())["padding"]
    assert padding["status"] == MEASURED and padding["ms_per_step"] == 0 and padding["gpu_hours"] == 0


def test_measured_losses_come_first_largest_first(two_ranks):
    names = [t["name"] for t in two_ranks.get(LEDGER).json()["terms"]]
    assert names[0] == "peak" and names[-1] == "useful"
    assert names[1:3] == ["stragglers", "padding"]  # 50% of the step, then about 24%


def test_both_databases_sum_the_window_alike(make_client, database_url, new_run):
    """The steady window (the kept totals less the first interval, the rank summaries) and a step
    range's sum over its rows (CASE, NULLIF, float casts) on SQLite and PostgreSQL."""
    client = make_client(database_url)
    assert client.post(RUNS, json=new_run(parallel={"dp": 2})).status_code == 201
    post_ranks(client, {0: 0.05, 1: 0.15}, loss=2.0)
    for params, steps in (({}, 20), ({"first_step": 11, "last_step": 30}, 20), ({"last_step": 30}, 30)):
        got = client.get(LEDGER, params=params).json()
        assert got["step_time_ms"] == pytest.approx(100.0) and got["steps"] == steps, params
        assert by_name(got)["stragglers"]["ms_per_step"] == pytest.approx(50.0), params


def test_a_step_range_is_its_own_window(two_ranks):
    got = two_ranks.get(LEDGER, params={"first_step": 1, "last_step": 10}).json()
    assert got["window"] == "steps" and (got["first_step"], got["last_step"]) == (1, 10) and got["steps"] == 10
    assert by_name(got)["stragglers"]["ms_per_step"] == pytest.approx(50.0)


def test_a_cpu_run_with_uncounted_syncs_says_not_measured_never_0(client, new_run):
    """No peak (a CPU) and syncs never counted: the peak, the useful work, the syncs and what
    remains have no value; padding and over-count, measured from the sums, do."""
    hardware = {"gpu_name": "cpu", "gpu_count": 1, "peak_tflops": None}
    assert client.post(RUNS, json=new_run(hardware=hardware, parallel={"dp": 1})).status_code == 201
    post_ranks(client, {0: 0.05}, syncs_counted=False)
    got = client.get(LEDGER).json()
    terms = by_name(got)
    for name in ("peak", "useful", "host_syncs", "data_wait", "launch_bound", "remainder"):
        assert terms[name]["status"] == NOT_MEASURED, name
        assert terms[name]["ms_per_step"] is None and terms[name]["gpu_hours"] is None, name
    assert terms["host_syncs"]["detail"]["syncs_per_iter"] is None
    assert terms["stragglers"]["status"] == "not applicable" and terms["stragglers"]["ms_per_step"] is None
    assert terms["padding"]["status"] == MEASURED and terms["padding"]["ms_per_step"] > 0
    assert got["overcount"]["status"] == MEASURED


def test_an_old_record_without_uncounted_steps_counts_its_syncs(client, new_run):
    """A record of an agent before `syncs.uncounted_steps` counted every step (docs/wire.md): its
    zero syncs are a measured 0, the one case where the sync term's time is 0."""
    assert client.post(RUNS, json=new_run(parallel={"dp": 1})).status_code == 201
    old = [packed_interval(k, syncs_per_step=0) for k in range(2)]
    for r in old:
        r["syncs"] = {"total": 0}
    assert client.post(f"{RUNS}/run-1/intervals", json={"intervals": old}).json()["accepted"] == 2
    syncs = by_name(client.get(LEDGER).json())["host_syncs"]
    assert syncs["status"] == MEASURED and syncs["ms_per_step"] == 0.0


def test_a_run_without_intervals_has_every_term_not_measured(client, new_run):
    assert client.post(RUNS, json=new_run()).status_code == 201
    got = client.get(LEDGER).json()
    assert got["steps"] is None and got["first_step"] is None and got["ranks"] == 0
    assert {t["status"] for t in got["terms"]} == {NOT_MEASURED}
    assert all(t["ms_per_step"] is None for t in got["terms"])
    assert got["overcount"]["status"] == NOT_MEASURED


def test_unknown_run_is_404_and_bad_steps_422(client):
    assert client.get(f"{RUNS}/nope/ledger").status_code == 404
    assert client.get(LEDGER, params={"first_step": -1}).status_code == 422


def test_the_openapi_schema_lists_the_route(client):
    schema = client.get("/openapi.json").json()
    route = schema["paths"]["/api/v1/runs/{run_id}/ledger"]["get"]
    assert {p["name"] for p in route["parameters"]} >= {"run_id", "first_step", "last_step"}
    assert "Ledger" in schema["components"]["schemas"]


def test_the_rest_is_what_measured_losses_leave_else_not_measured():
    useful = Term("useful", "useful work", 0.40, MEASURED, "", loss=False)
    padding = Term("padding", "padding", 0.10, MEASURED, "")
    stragglers = Term("stragglers", "stragglers", None, "not applicable", "one rank")
    rest = remainder_term(useful, [padding, stragglers])
    assert rest.status == ESTIMATED and rest.fraction == pytest.approx(0.50)
    waits = Term("data_wait", "data wait", None, NOT_MEASURED, "")
    unmeasured = remainder_term(useful, [padding, waits])
    assert unmeasured.status == NOT_MEASURED and unmeasured.fraction is None and "data wait" in unmeasured.source


# -- the ledger's own measurements (migration 0015): data wait, traced idle ----------------------
def measured_run(client, new_run, hardware=None, **between):
    """One rank, 3 intervals of 10 steps of 50 ms: 9 gaps of 20 ms of data wait each; 3 steps
    traced per interval, 150 ms of them, 30 ms idle after syncs and 15 ms otherwise (20% and 10%).
    `between`: the syncs' idle between the traced steps (traced_gaps, sync_idle_between_s), which
    an agent before it does not send."""
    body = new_run(parallel={"dp": 1}, **({"hardware": hardware} if hardware else {}))
    assert client.post(RUNS, json=body).status_code == 201
    batch = []
    for k in range(3):
        r = packed_interval(k, docs_per_pack=DOCS, doc_len=DOC, pack=PACK, gpu_time_s=0.5)
        r.update(data_wait_s=0.18, data_wait_gaps=9, traced_steps=3, traced_step_time_s=0.15)
        r.update(traced_busy_s=0.105, sync_idle_s=0.03, launch_idle_s=0.015, **between)
        batch.append(r)
    assert client.post(f"{RUNS}/run-1/intervals", json={"intervals": batch}).json()["accepted"] == 3
    return client.get(LEDGER).json()


def test_the_measured_terms_and_the_rest_by_hand(client, new_run, spec: ModelSpec):
    got = measured_run(client, new_run)
    terms = by_name(got)
    assert got["step_time_ms"] == pytest.approx(50.0) and got["iteration_ms"] == pytest.approx(70.0)
    wait = terms["data_wait"]
    assert wait["status"] == MEASURED and not wait["within_step"]
    # Host time outside the step, whoever spent it: the loader is one cause, not the name.
    assert wait["label"] == "host time between steps" and {"loader", "logging"} <= set(
        wait["fix"].replace(",", " ").split()
    )
    assert wait["ms_per_step"] == pytest.approx(20.0) and wait["pct_of_step"] == pytest.approx(40.0)
    syncs, launch = terms["host_syncs"], terms["launch_bound"]
    assert syncs["status"] == ESTIMATED and syncs["ms_per_step"] == pytest.approx(10.0)  # 20% of 50 ms
    assert launch["status"] == ESTIMATED and launch["ms_per_step"] == pytest.approx(5.0)  # 10%
    (site,) = syncs["detail"]["sites"]  # one site: all of the sync time, by its share of the syncs
    assert (site["site"], site["per_iter"], site["share_of_time"]) == ("train.py:88", pytest.approx(3.0), 1.0)
    assert site["fix"].startswith("at train.py:88: ")
    # Records without the syncs' idle between steps: the whole gap stays the data wait's, as before.
    assert syncs["detail"]["between_steps"] is None and "between steps not measured" in syncs["source"]
    assert syncs["detail"]["host_blocked_ms"] is None  # nor the host's time blocked in them
    assert wait["detail"]["to_host_syncs_ms"] is None
    # The rest: 1 - useful - padding - syncs - launch-bound; the data wait lies outside the step.
    computed = PACK * spec.c_lin + DOCS * DOC**2 * spec.c_core
    padding = (PACK - DOCS * DOC) * spec.c_lin / computed
    useful = (computed - (PACK - DOCS * DOC) * spec.c_lin) / (989e12 * 0.05)
    rest = terms["remainder"]
    assert rest["status"] == ESTIMATED
    assert rest["pct_of_step"] == pytest.approx(100 * (1 - useful - padding - 0.2 - 0.1))


def test_each_loss_says_what_removing_it_gains(client, new_run, spec: ModelSpec):
    got = measured_run(client, new_run)
    terms = by_name(got)
    mfu = terms["useful"]["pct_of_step"] / 100
    syncs = terms["host_syncs"]["gain"]  # 10 ms of a 50 ms step, 70 ms iteration
    assert syncs["step_ms_after"] == pytest.approx(40.0) and syncs["iteration_ms_after"] == pytest.approx(60.0)
    assert syncs["speedup_pct"] == pytest.approx(100 * 10 / 70)
    assert syncs["mfu_useful_after"] == pytest.approx(mfu * 50 / 40)
    wait = terms["data_wait"]["gain"]  # the step stays, and so does MFU (it divides by GPU step time)
    assert wait["step_ms_after"] == pytest.approx(50.0) and wait["iteration_ms_after"] == pytest.approx(50.0)
    assert wait["speedup_pct"] == pytest.approx(100 * 20 / 70) and wait["mfu_useful_after"] == pytest.approx(mfu)
    assert terms["peak"]["gain"] is None and terms["useful"]["gain"] is None and terms["remainder"]["gain"] is None
    assert terms["stragglers"]["gain"] is None  # not applicable on one rank


def test_the_idle_between_steps_that_syncs_began_moves_from_the_data_wait_to_the_syncs(client, new_run, spec):
    """Of the 20 ms a gap, the trace found 10 ms a gap (2 traced gaps an interval, 20 ms) in gaps
    a host sync began: that much of the data wait is the syncs'. The iteration stays 70 ms; the
    syncs cost 10 ms inside the step and 10 ms between steps; the rest is as before."""
    got = measured_run(client, new_run, traced_gaps=2, sync_idle_between_s=0.02)
    terms = by_name(got)
    assert got["step_time_ms"] == pytest.approx(50.0) and got["iteration_ms"] == pytest.approx(70.0)
    syncs, wait = terms["host_syncs"], terms["data_wait"]
    assert syncs["status"] == ESTIMATED and syncs["within_step"]
    assert syncs["ms_per_step"] == pytest.approx(20.0) and syncs["pct_of_step"] == pytest.approx(40.0)
    assert syncs["detail"]["inside_step"] == pytest.approx(0.2) and syncs["detail"]["between_steps"] == pytest.approx(
        0.2
    )
    assert wait["status"] == ESTIMATED and not wait["within_step"]  # less a part scaled from the traced gaps
    assert wait["ms_per_step"] == pytest.approx(10.0)
    assert wait["detail"]["measured_ms"] == pytest.approx(20.0) and wait["detail"]["to_host_syncs_ms"] == pytest.approx(
        10.0
    )
    # Removing the syncs: the step loses its 10 ms, the iteration 20 ms; MFU gains by the step's only.
    mfu = terms["useful"]["pct_of_step"] / 100
    gain = syncs["gain"]
    assert gain["step_ms_after"] == pytest.approx(40.0) and gain["iteration_ms_after"] == pytest.approx(50.0)
    assert gain["speedup_pct"] == pytest.approx(100 * 20 / 70) and gain["mfu_useful_after"] == pytest.approx(
        mfu * 50 / 40
    )
    assert wait["gain"]["iteration_ms_after"] == pytest.approx(60.0) and wait["gain"]["step_ms_after"] == pytest.approx(
        50.0
    )
    # The rest subtracts the syncs' time inside the step only (the data wait's never).
    computed = PACK * spec.c_lin + DOCS * DOC**2 * spec.c_core
    padding = (PACK - DOCS * DOC) * spec.c_lin / computed
    useful = (computed - (PACK - DOCS * DOC) * spec.c_lin) / (989e12 * 0.05)
    assert terms["remainder"]["pct_of_step"] == pytest.approx(100 * (1 - useful - padding - 0.2 - 0.1))


@pytest.mark.parametrize(
    ("blocked", "between", "syncs_ms", "between_ms", "wait_ms", "launch_ms"),
    [
        # 10 ms a step blocked in the steps, 2 ms a gap between them: 12 ms of the 35 ms of idle
        # an iteration (10 after syncs, 20 between steps, 5 launch-bound), after the syncs first.
        (0.03, 0.004, 12.0, 2.0, 18.0, 5.0),
        # Blocked longer than all the idle: the syncs take all of it, the data wait's and the
        # launch-bound idle's too (without them the host would have run ahead over it).
        (0.3, 0.0, 35.0, 20.0, 0.0, 0.0),
        # Blocked 4 ms a step: 4 of the 10 ms after the syncs are theirs; the other 6 the host's
        # (without the syncs it would have idled the GPU as long): launch-bound.
        (0.012, 0.0, 4.0, 0.0, 20.0, 11.0),
    ],
)
def test_with_the_hosts_blocked_time_the_syncs_take_the_idle_it_would_have_covered(
    make_client, new_run, spec, blocked, between, syncs_ms, between_ms, wait_ms, launch_ms
):
    """The run of the tests above (a 50 ms step, 20 ms between steps; per step, 10 ms idle after
    syncs and 5 ms launch-bound), its records now with the host's time blocked in syncs (per
    interval: 3 traced steps, 2 traced gaps). The syncs' time is min(the idle, the blocked time);
    the step's other parts do not move: the rest is what it was."""
    got = measured_run(
        make_client(), new_run, traced_gaps=2, sync_idle_between_s=0.02, sync_blocked_s=blocked,
        sync_blocked_between_s=between,
    )  # fmt: skip
    terms = by_name(got)
    syncs, wait, launch = terms["host_syncs"], terms["data_wait"], terms["launch_bound"]
    assert syncs["detail"]["host_blocked_ms"] == pytest.approx(blocked * 1e3 / 3 + between * 1e3 / 2)
    assert syncs["detail"]["loop_ms"] is None  # an agent before the loops' split: not 0
    assert syncs["ms_per_step"] == pytest.approx(syncs_ms) and syncs["status"] == ESTIMATED
    assert syncs["detail"]["between_steps"] * 50 == pytest.approx(between_ms)
    assert wait["ms_per_step"] == pytest.approx(wait_ms) and launch["ms_per_step"] == pytest.approx(launch_ms)
    assert wait["detail"]["to_host_syncs_ms"] == pytest.approx(between_ms)
    assert got["iteration_ms"] == pytest.approx(70.0)
    assert syncs["gain"]["speedup_pct"] == pytest.approx(100 * syncs_ms / 70)
    assert syncs["gain"]["iteration_ms_after"] == pytest.approx(70.0 - syncs_ms)
    computed = PACK * spec.c_lin + DOCS * DOC**2 * spec.c_core
    padding = (PACK - DOCS * DOC) * spec.c_lin / computed
    useful = (computed - (PACK - DOCS * DOC) * spec.c_lin) / (989e12 * 0.05)
    assert terms["remainder"]["pct_of_step"] == pytest.approx(100 * (1 - useful - padding - 0.2 - 0.1))


def test_the_idle_inside_the_syncs_loops_is_theirs_whole(client, new_run):
    """The run above, its 10 ms a step after syncs now split: 6 ms of it inside a loop of reads
    that returned at once (whose fix removes the host's work between them), whose closing reads
    blocked 1 ms of the host's 4 ms a step. The loop's idle is the syncs' whole; the other syncs
    take what the host's 3 ms left would have covered; the rest of the idle after them is
    launch-bound. Without the split (an agent before it) the cap takes 4 ms in all."""
    got = measured_run(
        client, new_run, traced_gaps=2, sync_idle_between_s=0.0, sync_blocked_s=0.012, sync_blocked_between_s=0.0,
        sync_loop_idle_s=0.018, sync_loop_blocked_s=0.003,
    )  # fmt: skip
    terms = by_name(got)
    syncs, wait, launch = terms["host_syncs"], terms["data_wait"], terms["launch_bound"]
    assert syncs["ms_per_step"] == pytest.approx(6.0 + 3.0) and syncs["detail"]["loop_ms"] == pytest.approx(6.0)
    assert "inside loops of reads" in syncs["source"]
    assert launch["ms_per_step"] == pytest.approx(5.0 + 1.0) and wait["ms_per_step"] == pytest.approx(20.0)
    assert syncs["gain"]["iteration_ms_after"] == pytest.approx(70.0 - 9.0)


def test_the_syncs_between_steps_take_at_most_the_data_wait(client, new_run):
    """The traced gaps are a sample: where they held more idle after syncs (30 ms a gap) than the
    data wait measured over every gap (20 ms), the syncs take the whole data wait and no more."""
    got = measured_run(client, new_run, traced_gaps=2, sync_idle_between_s=0.06)
    terms = by_name(got)
    assert terms["data_wait"]["ms_per_step"] == 0 and terms["host_syncs"]["ms_per_step"] == pytest.approx(30.0)
    assert got["iteration_ms"] == pytest.approx(70.0)


def test_old_records_leave_the_new_terms_not_measured_never_0(two_ranks):
    """Records of an agent before the ledger's measurements (packed_interval sends none of them)."""
    got = two_ranks.get(LEDGER).json()
    terms = by_name(got)
    for name in ("data_wait", "launch_bound"):
        assert terms[name]["status"] == NOT_MEASURED and terms[name]["ms_per_step"] is None, name
        assert terms[name]["gain"] is None
    assert got["iteration_ms"] == pytest.approx(got["step_time_ms"])
    assert got["memory"]["status"] == NOT_MEASURED and got["memory"]["free_pct"] is None


def test_memory_headroom_is_a_hint_from_the_devices_total(client, new_run):
    hardware = {"gpu_name": "NVIDIA H200", "gpu_count": 1, "peak_tflops": 989.0, "memory_bytes": 100 * 2**30}
    assert client.post(RUNS, json=new_run(parallel={"dp": 1}, hardware=hardware)).status_code == 201
    recs = [packed_interval(k, gpu={"mem_used_bytes": 40.0 * 2**30}) for k in range(2)]
    assert client.post(f"{RUNS}/run-1/intervals", json={"intervals": recs}).json()["accepted"] == 2
    memory = client.get(LEDGER).json()["memory"]
    assert memory["status"] == MEASURED and memory["free_pct"] == pytest.approx(60.0) and memory["hint"]
    assert "memory" not in {t["name"] for t in client.get(LEDGER).json()["terms"]}  # not a time term
