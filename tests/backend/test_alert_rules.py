"""The alert rules' building blocks, pure (backend/alerts/rules.py): the streak that opens and
resolves, and the thresholds' checks."""

import pytest

from packscope.backend.alerts.rules import Thresholds, judged_streak, streak


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
