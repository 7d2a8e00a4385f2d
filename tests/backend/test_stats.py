"""The rank test behind the compare page's step-time verdict, against values worked by hand."""

import math
import random

import pytest

from packscope.backend.reads.stats import mann_whitney_u


def test_fully_separated_samples():
    # Ranks of a = 1, 2, 3 -> U = 0; mean 4.5, variance 3*3*7/12 = 5.25.
    r = mann_whitney_u([1, 2, 3], [4, 5, 6])
    assert r["u"] == 0
    assert r["z"] == pytest.approx(-4.5 / math.sqrt(5.25))
    assert r["p_value"] == pytest.approx(0.049535, abs=1e-5)  # 2 * (1 - Phi(1.9640))


def test_ties_use_average_ranks_and_shrink_the_variance():
    # Pooled [1, 2, 2, 3]: ranks 1, 2.5, 2.5, 4. a = [1, 2] -> rank sum 3.5, U = 0.5.
    # Ties: one group of 2 -> Σ(t³ - t) = 6; variance = 2*2/12 * (5 - 6/12) = 1.5.
    r = mann_whitney_u([1, 2], [2, 3])
    assert r["u"] == pytest.approx(0.5)
    assert r["z"] == pytest.approx((0.5 - 2) / math.sqrt(1.5))


def test_identical_samples_and_too_few_values():
    assert mann_whitney_u([5, 5, 5], [5, 5])["p_value"] == 1.0
    assert mann_whitney_u([1.0], [2.0, 3.0]) is None


def test_a_real_shift_is_found_and_no_shift_is_not():
    rng = random.Random(0)
    base = [0.100 + rng.gauss(0, 0.004) for _ in range(200)]
    same = [0.100 + rng.gauss(0, 0.004) for _ in range(200)]
    slower = [0.102 + rng.gauss(0, 0.004) for _ in range(200)]  # +2%
    assert mann_whitney_u(base, same)["p_value"] > 0.01
    assert mann_whitney_u(base, slower)["p_value"] < 1e-4
