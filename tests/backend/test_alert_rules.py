"""The alert rules' building blocks, pure (backend/alerts/rules.py): the streak that opens and
resolves, the stalled rule's resolving streak, and the thresholds' checks."""

import pytest

from packscope.backend.alerts.rules import CLEAR, Firing, Interval, RunFacts, Thresholds, judged_streak, stalled, streak
from packscope.core.catalogue import Coefficients

C = Coefficients(c_lin=1_234_567, c_core=89, peak_tflops=989.0)
# A cadence of 10 s; the limit is then max(30, 3 x 10) = 30 s.
STALL = Thresholds(stalled_floor_s=30.0, stalled_gap_factor=3.0, stalled_resolve_intervals=3)


def stalled_history(ends: list[float], until: float, t: Thresholds = STALL) -> list[tuple[float, str]]:
    """The stalled alert's opens and resolves when the run's intervals end (and arrive) at `ends`
    and the server judges it every second until `until`, as the sweep does."""
    history: list[tuple[float, str]] = []
    is_open = False
    for now in range(int(until) + 1):
        arrived = [Interval(k, end, {}, {}) for k, end in enumerate(ends) if end <= now]
        if not arrived:
            continue
        facts = RunFacts(shown_status="running", silent_s=now - arrived[-1].wall_end, layout="thd", coefficients=C)
        verdict = stalled(facts, arrived, t).get("")
        if isinstance(verdict, Firing) and not is_open:
            is_open = True
            history.append((now, "opened"))
        elif verdict == CLEAR and is_open:
            is_open = False
            history.append((now, "resolved"))
    return history


def test_a_run_that_limps_keeps_one_stalled_alert_open_until_it_is_back_at_its_cadence():
    regular = [10.0 * k for k in range(12)]  # intervals every 10 s up to 110 s
    limping = [155.0, 200.0, 250.0, 290.0]  # then one every 40-50 s, each past the 30 s limit
    back = [300.0, 310.0, 320.0, 330.0]
    history = stalled_history(regular + limping + back, until=340)
    # Each silence past 30 s, and each interval after one: the old rule (the next interval
    # resolves) opened and resolved it four times here.
    assert history == [(141, "opened"), (320, "resolved")]  # 320: the third interval at its cadence


def test_a_stall_resolves_after_the_streak_not_on_the_first_interval_after_it():
    ends = [10.0 * k for k in range(10)] + [200.0, 210.0, 220.0, 230.0]  # silent from 90 s to 200 s
    assert stalled_history(ends, until=240) == [(121, "opened"), (230, "resolved")]
    one = Thresholds(stalled_floor_s=30.0, stalled_gap_factor=3.0, stalled_resolve_intervals=1)
    assert stalled_history(ends, until=240, t=one) == [(121, "opened"), (210, "resolved")]


def test_a_backlog_whose_intervals_ended_at_the_cadence_resolves_a_stall_at_once():
    # The agent could not send from 50 s to 150 s (the trainer ran on): its intervals arrive together.
    facts = RunFacts(shown_status="running", silent_s=0.0, layout="thd", coefficients=C)
    intervals = [Interval(k, 10.0 * k, {}, {}) for k in range(16)]
    assert stalled(facts, intervals, STALL) == {"": CLEAR}
    silent = RunFacts(shown_status="running", silent_s=95.0, layout="thd", coefficients=C)
    assert isinstance(stalled(silent, intervals[:6], STALL)[""], Firing)


def test_a_streak_counts_measured_intervals_only():
    assert streak([False, True, None, True, True], 3, 3) is True  # the None neither breaks nor counts
    assert streak([False, True, True], 3, 3) is None  # two of three
    assert streak([True, False, False, None, False], 3, 3) is False
    assert streak([True, False, True], 3, 3) is None  # mixed: neither
    assert streak([None, None], 1, 1) is None  # nothing measured


def test_one_breach_opens_when_the_rule_asks_for_one():
    assert streak([False, False, True], 1, 3) is True
    assert streak([True, False, False], 1, 3) is None
    assert streak([True, False, False, False], 1, 3) is False


def test_a_breaching_streak_no_alert_covered_fires_after_it_cleared():
    b = [(4, False), (5, True), (6, None), (7, True), (8, True), (9, True), (10, False), (11, False), (12, False)]
    assert judged_streak(b, 3, 3, None) == (True, [5, 7, 8, 9])  # the whole streak; 6 (unmeasured) breaks nothing
    assert judged_streak(b, 3, 3, 9.0) == (False, [])  # covered through its last interval: clear
    assert judged_streak(b, 3, 3, 8.0) == (True, [5, 7, 8, 9])  # an alert that covered part of it
    assert judged_streak(b[:-1], 3, 3, 9.0) == (None, [])  # two clear of three: undecided
    assert judged_streak(b[:6], 3, 3, 9.0) == (True, [7, 8, 9])  # the latest three breach: firing, covered or not
    assert judged_streak([(1, True), (2, True), (3, False)], 3, 3, None) == (None, [])  # two breaches are no streak


def test_thresholds_merge_in_order_and_are_checked():
    t = Thresholds.merged({"slowdown_pct": 30}, {"slowdown_pct": 40, "mfu_floor": 0.3}, {"mfu_floor": None})
    assert (t.slowdown_pct, t.mfu_floor, t.straggler_pct) == (40.0, None, Thresholds().straggler_pct)
    assert isinstance(Thresholds.checked({"slowdown_intervals": 4.0}).slowdown_intervals, int)
    for bad in ({"slowdown_intervals": 2.5}, {"slowdown_pct": -1}, {"slowdown_pct": float("nan")},
                {"slowdown_intervals": 0}, {"slowdown_pct": True}, {"nope": 1}):  # fmt: skip
        with pytest.raises(ValueError):
            Thresholds.checked(bad)
    assert Thresholds.checked({"warmup_intervals": 0}).warmup_intervals == 0
