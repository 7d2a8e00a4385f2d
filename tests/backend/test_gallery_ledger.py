"""The gallery's before/after pairs are the ledger's ground truth (issue 36, docs/ledger.md).

Each pair's runs are imported into a server and its ledger read through the API. A pair's fix
removes one term (its run files' `removes:<term>` tag, written by bench/fixes_runs.py; for files
recorded before the tag, the pair's name says which). The realized gain is the iteration's
(the event-timed step plus the host time between steps, where measured) from before to after;
the predicted gain is the before-ledger's `gain.speedup_pct` of that term:

* where the after is at least 10% faster, the before must name the removed term as its largest
  loss (the rest, what no setting removes, aside), with the prediction within 30% of the
  realized gain;
* where the fix gains less, the prediction must be within 2 points of the iteration time.

A pair recorded in rounds (`bench/fixes_runs.py --rounds N`: before and after in turn, each
file tagged `round:<k>`) is judged on its rounds' medians: the realized gain from the median
iterations, the predicted gain the median of the befores' predictions, the largest loss by its
mean over the befores. A host that drifts between recordings then slows both sides alike.

A pair whose before file lacks the term's measurement (recorded by an agent before the ledger's
measurements) cannot be judged and is left out; with none left the test skips, naming
`bash bench/gpu_session.sh ledger`, which re-records the pairs. PACKSCOPE_GALLERY_DIR points the
test at another folder of run files (the GPU session's output).
"""

import json
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from packscope.core.run_file import read_run_file

GALLERY = Path(os.environ.get("PACKSCOPE_GALLERY_DIR") or Path(__file__).resolve().parents[2] / "gallery")
# Other recordings of the gallery's pairs (the gallery holds one a pair), judged as it is: a folder
# a GPU session, named by its date, time and card. Left out where PACKSCOPE_GALLERY_DIR is set.
RECORDINGS = Path(__file__).resolve().parents[1] / "data" / "ledger_pairs"
# Files recorded before bench/fixes_runs.py tagged what a pair removes: by the pair's name.
REMOVED_BY_NAME = {"logging": "host_syncs", "channel-loss": "host_syncs", "graphs": "launch_bound"}
CLEARLY_FASTER = 0.10
RELATIVE_TOLERANCE = 0.30
SMALL_GAIN_POINTS = 0.02
# Pairs the ledger is known to mis-predict, each with why (docs/ledger.md, "The gallery's ground
# truth"). Each must still miss: once the ledger predicts it, the test fails until it leaves here.
KNOWN_MISSES = {
    "graphs-1b": "the graphs' own cost (their replays ran 0.8% slower than the eager steps) is not priced: the "
    "launch-bound idle alone predicts a 1.6% gain",
    # Other recordings (tests/data/ledger_pairs/): the per-document loop's fix removes host work
    # that an agent before the loops' split (sync_loop_idle_s) could not tell from host work that stays.
    "2026-12-07-0917-h100/channel-loss-125m": "the per-document loop's fix also removes the loop's own host "
    "work (about 18 ms a step on that host), which these records (before the loops' split) cannot tell from "
    "host work that stays: "
    "predicted 9.8% (the host's blocked time) against 25.9%, and the launch-bound idle comes out largest",
    "2026-12-07-0951-h100/channel-loss-125m": "the same: the loop's own host work, about 8 ms a step on that host "
    "(the before's host time less its blocked time, 76 ms, against the after's iteration, 68 ms), is not priced: "
    "predicted 14.5% against 24.5%",
    # Recorded with the syncs' loops split (19:35-19:37, one H100 whose host ran slower from one
    # recording to the next: the same logging "after" took 68.8, 87.8 and 71.6 ms an iteration).
    # The loops' idle priced whole over-predicts where the fixed run stayed launch-bound.
    "2026-12-07-1935-h100/channel-loss-125m": "the loop's idle (10.9 ms) priced whole over-predicts: 21.9% "
    "against 14.9%; the fixed run still idled the GPU 9.3 ms a step launch-bound and 4.2 ms between steps",
    "2026-12-07-1936-h100/logging-125m": "the per-bucket loop's idle (24.2 ms) priced whole over-predicts: 34.1% "
    "against 12.7%; the fixed run came on a slower stretch of the host (80.5 ms a step, 16.9 ms of it launch-bound, "
    "against 68.5 and 4.4 a minute before)",
    "2026-12-07-1937-h100/logging-125m": "the same over-prediction, smaller: 25.3% against 17.8%; the fixed run "
    "idled the GPU 6.0 ms a step launch-bound",
    # Recorded in three rounds, before and after in turn (2026-12-08 01:18, one H100): the rounds'
    # medians predict logging-125m (23.6% against 21.5%; one round of three alone did).
    "2026-12-08-0117-h100/channel-loss-125m": "the loop's idle priced whole over-predicts in two rounds of three: "
    "21.5% against 15.5% at the medians; the fixed runs idled the GPU 9-14 ms a step launch-bound and 4-5 ms "
    "between steps, more host time than the before's less what the fix removes",
    "2026-12-08-0120-h100/graphs-1b": "the same as graphs-1b: the replays ran 1.0% slower than the eager steps "
    "(predicted 1.5%; one round: the second ran out of memory)",
    "2026-12-08-0136-h100/graphs-1b": "the same in three rounds: the replays 0.8-1.0% slower in each (282.1-282.3 "
    "against 280.0-280.1 ms a step), predicted 1.5-1.7%",
}


def gallery_pairs(folder: Path) -> dict[str, dict[str, Any]]:
    """{pair: {"before": [RunFile], "after": [RunFile], "removes": term or None}} of the folder's
    files, each role's runs in the order of their rounds (one run where not recorded in rounds)."""
    pairs: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.jsonl")):
        run = read_run_file(path)
        tags = run.run.get("tags", [])
        name = next((t.removeprefix("pair:") for t in tags if t.startswith("pair:")), None)
        role = "before" if "before" in tags else "after" if "after" in tags else None
        if name is None or role is None:
            continue
        entry = pairs.setdefault(name, {"removes": None, "before": {}, "after": {}})
        round_ = int(next((t.removeprefix("round:") for t in tags if t.startswith("round:")), 1))
        assert round_ not in entry[role], f"{path}: a second {role} of {name} in round {round_}"
        entry[role][round_] = run
        tagged = next((t.removeprefix("removes:") for t in tags if t.startswith("removes:")), None)
        by_name = next((term for prefix, term in REMOVED_BY_NAME.items() if name.startswith(prefix)), None)
        entry["removes"] = entry["removes"] or tagged or by_name
    complete = {}
    for name, p in pairs.items():
        if p["before"] and p["after"] and p["removes"]:
            assert sorted(p["before"]) == sorted(p["after"]), (
                f"{name}: rounds {sorted(p['before'])} against {sorted(p['after'])}"
            )
            complete[name] = {**p, **{role: [p[role][k] for k in sorted(p[role])] for role in ("before", "after")}}
    return complete


def ledger_of(client, run) -> dict[str, Any]:
    assert client.post("/api/v1/runs", json=run.run).status_code in (200, 201)
    run_id = run.run["run_id"]
    answer = client.post(f"/api/v1/runs/{run_id}/intervals", json={"intervals": run.records}).json()
    assert answer["accepted"] == len(run.records), answer
    return client.get(f"/api/v1/runs/{run_id}/ledger").json()


def iteration_ms(ledger: dict[str, Any]) -> float:
    """The user's wall clock per step: the event-timed step plus the host time between steps
    (where measured). Records from an agent before the gaps holding its own emission were left
    out (agent/timing.py's agent_worked) carry that work in the after runs' gaps: re-record them."""
    return ledger["iteration_ms"] if ledger.get("iteration_ms") is not None else ledger["step_time_ms"]


def judge(befores: Sequence[dict[str, Any]], afters: Sequence[dict[str, Any]], removes: str) -> tuple[str, str] | None:
    """(verdict, why) of a pair's ledgers, one per round: "ok", "wrong", or None where a before
    cannot be judged. Over several rounds, the medians (module docstring)."""
    removed = [{t["name"]: t for t in b["terms"]}[removes] for b in befores]
    if any(t["ms_per_step"] is None or t.get("gain") is None for t in removed):
        return None
    before_ms, after_ms = (statistics.median(iteration_ms(x) for x in side) for side in (befores, afters))
    realized = 1.0 - after_ms / before_ms
    predicted = statistics.median(t["gain"]["speedup_pct"] for t in removed) / 100.0
    rounds = f" (medians of {len(befores)} rounds)" if len(befores) > 1 else ""
    figures = f"predicted {100 * predicted:.1f}%, realized {100 * realized:.1f}%{rounds}"
    parts = f"iteration {_parts(_middle(befores))} -> {_parts(_middle(afters))} ms (step + host time between steps)"
    if realized >= CLEARLY_FASTER:
        mean_ms: dict[str, float] = {}
        for b in befores:
            for t in b["terms"]:
                if t["loss"] and t["name"] != "remainder" and t["ms_per_step"] is not None:
                    mean_ms[t["name"]] = mean_ms.get(t["name"], 0.0) + t["ms_per_step"] / len(befores)
        largest = max(mean_ms, key=mean_ms.__getitem__)
        if largest != removes:
            return "wrong", f"largest loss is {largest}, not {removes}; {figures}; {parts}"
        if abs(predicted - realized) > RELATIVE_TOLERANCE * realized:
            return "wrong", f"{figures}: more than {RELATIVE_TOLERANCE:.0%} apart; {parts}"
        return "ok", figures
    if abs(predicted - realized) > SMALL_GAIN_POINTS:
        return "wrong", f"{figures}: more than {100 * SMALL_GAIN_POINTS:g} points apart; {parts}"
    return "ok", figures


def _middle(ledgers: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The round whose iteration is the median (the lower one of an even count), for a verdict's reader."""
    return sorted(ledgers, key=iteration_ms)[(len(ledgers) - 1) // 2]


def against_known_misses(name: str, verdict: tuple[str, str]) -> str | None:
    """What is wrong with a pair's verdict given KNOWN_MISSES, or None: a known miss must still
    miss; every other pair must be predicted."""
    ok, why = verdict[0] == "ok", verdict[1]
    if name in KNOWN_MISSES:
        return f"{name}: now predicted ({why}): take it off KNOWN_MISSES" if ok else None
    return None if ok else f"{name}: {why}"


def _parts(ledger: dict[str, Any]) -> str:
    """The iteration as its step and the host time between steps, for a verdict's reader."""
    return f"{ledger['step_time_ms']:.4g} + {iteration_ms(ledger) - ledger['step_time_ms']:.3g}"


def recordings() -> list[tuple[str, Path]]:
    """(prefix of its pairs' names, folder): the gallery, then the other recordings."""
    others = [] if os.environ.get("PACKSCOPE_GALLERY_DIR") else sorted(p for p in RECORDINGS.iterdir() if p.is_dir())
    return [("", GALLERY)] + [(f"{folder.name}/", folder) for folder in others]


def test_the_ledger_predicts_each_gallery_fix(make_client):
    judged, wrong = {}, []
    for prefix, folder in recordings():
        for pair_name, pair in sorted(gallery_pairs(folder).items()):
            name = prefix + pair_name
            client = make_client()
            before, after = ([ledger_of(client, run) for run in pair[role]] for role in ("before", "after"))
            verdict = judge(before, after, pair["removes"])
            if verdict is None:
                continue
            judged[name] = verdict
            problem = against_known_misses(name, verdict)
            if problem:
                wrong.append(problem)
    if not judged:
        rerecord = "`bash bench/gpu_session.sh ledger` re-records them"
        pytest.skip(f"no pair in {GALLERY} carries the ledger's measurements; {rerecord}")
    assert not wrong, "\n".join(wrong)


def _ledger(step_ms: float, terms: list[tuple[str, float | None, float | None]], wait_ms: float = 0.0) -> dict:
    return {
        "step_time_ms": step_ms,
        "iteration_ms": step_ms + wait_ms,
        "terms": [
            {"name": n, "loss": True, "ms_per_step": ms, "gain": None if speedup is None else {"speedup_pct": speedup}}
            for n, ms, speedup in terms
        ],
    }


def test_the_judge_names_a_wrong_largest_term_a_far_prediction_and_an_unmeasured_before():
    before = _ledger(100.0, [("host_syncs", 30.0, 30.0), ("padding", 10.0, 10.0), ("remainder", 50.0, None)])
    assert judge([before], [_ledger(72.0, [])], "host_syncs") == ("ok", "predicted 30.0%, realized 28.0%")
    assert judge([before], [_ledger(88.0, [])], "padding")[0] == "wrong"  # 12% faster: padding is not the largest
    assert judge([before], [_ledger(50.0, [])], "host_syncs")[0] == "wrong"  # 50% realized, 30% predicted
    assert judge([before], [_ledger(99.0, [])], "host_syncs")[0] == "wrong"  # a small gain, predicted large
    small = _ledger(100.0, [("launch_bound", 2.0, 2.0), ("host_syncs", 5.0, 5.0)])
    assert judge([small], [_ledger(97.0, [])], "launch_bound")[0] == "ok"  # 3% realized, 2% predicted
    unmeasured = _ledger(100.0, [("launch_bound", None, None)])
    assert judge([unmeasured], [_ledger(50.0, [])], "launch_bound") is None


def test_the_data_wait_counts_in_the_iteration_it_lengthens():
    before = _ledger(60.0, [("data_wait", 40.0, 40.0)], wait_ms=40.0)
    assert judge([before], [_ledger(60.0, [], wait_ms=0.5)], "data_wait") == ("ok", "predicted 40.0%, realized 39.5%")


def test_a_known_miss_must_still_miss_and_every_other_pair_be_predicted():
    miss, hit = ("wrong", "predicted 7.9%, realized 13.1%"), ("ok", "predicted 13.0%, realized 13.1%")
    assert against_known_misses("graphs-1b", miss) is None
    assert "take it off KNOWN_MISSES" in against_known_misses("graphs-1b", hit)
    assert against_known_misses("padding-125m", hit) is None
    assert against_known_misses("padding-125m", miss) == "padding-125m: predicted 7.9%, realized 13.1%"


def test_rounds_are_judged_on_their_medians_so_one_slow_stretch_of_the_host_does_not_decide():
    before = _ledger(100.0, [("host_syncs", 30.0, 30.0), ("remainder", 50.0, None)])
    drifted = _ledger(130.0, [("host_syncs", 30.0, 23.0), ("remainder", 80.0, None)])
    slow_after = _ledger(95.0, [])
    assert judge([before], [slow_after], "host_syncs")[0] == "wrong"  # that round alone: 5% realized
    verdict = judge([before, drifted, before], [_ledger(72.0, []), slow_after, _ledger(71.0, [])], "host_syncs")
    assert verdict == ("ok", "predicted 30.0%, realized 28.0% (medians of 3 rounds)")
    # The largest loss by its mean over the befores: a term largest in one round alone is not.
    odd = _ledger(100.0, [("host_syncs", 30.0, 30.0), ("padding", 80.0, 80.0)])
    assert judge([before, odd, before], [_ledger(72.0, [])] * 3, "host_syncs")[0] == "ok"
    assert judge([odd, odd, before], [_ledger(72.0, [])] * 3, "host_syncs")[1].startswith("largest loss is padding")


def _tagged_copy(source: Path, folder: Path, name: str, tags: list[str]) -> None:
    head, rest = source.read_text().split("\n", 1)
    line = json.loads(head)
    line["run"]["tags"] = tags
    line["run"]["run_id"] = name
    (folder / f"{name}.jsonl").write_text(json.dumps(line) + "\n" + rest)


def test_a_pair_recorded_in_rounds_is_one_pair_with_its_runs_in_round_order(tmp_path):
    source = Path(__file__).resolve().parents[2] / "gallery" / "padding-125m-before.jsonl"  # the shipped one
    for k in (2, 1, 3):
        for role in ("before", "after"):
            _tagged_copy(
                source,
                tmp_path,
                f"padding-125m-r{k}-{role}",
                ["pair:padding-125m", role, f"round:{k}", "removes:padding"],
            )
    _tagged_copy(source, tmp_path, "logging-125m-after", ["pair:logging-125m", "after"])  # no before: left out
    pairs = gallery_pairs(tmp_path)
    assert list(pairs) == ["padding-125m"]
    assert pairs["padding-125m"]["removes"] == "padding"
    assert [r.run["run_id"] for r in pairs["padding-125m"]["before"]] == [
        f"padding-125m-r{k}-before" for k in (1, 2, 3)
    ]
    _tagged_copy(
        source, tmp_path, "padding-125m-r4-before", ["pair:padding-125m", "before", "round:4", "removes:padding"]
    )
    with pytest.raises(AssertionError, match="rounds"):
        gallery_pairs(tmp_path)
