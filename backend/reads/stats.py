"""Is one run's step time really different from another's? A rank test on step-time windows.

Per-interval step times are not normal (stalls, checkpoint steps, warm-up), so the comparison
uses the Mann-Whitney U test, with the normal approximation and the correction for ties; it is
pure Python on purpose (no SciPy on the server).
"""

import math
from collections.abc import Sequence


def _ranks(values: Sequence[float]) -> tuple[list[float], float]:
    """Average ranks (1-based) of `values`, and Σ(t³ - t) over groups of ties."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    ties = 0.0
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        t = j - i + 1
        ties += t**3 - t
        i = j + 1
    return ranks, ties


def mann_whitney_u(a: Sequence[float], b: Sequence[float]) -> dict[str, float] | None:
    """U of `a`, the z score and the two-sided p-value; None when a side has fewer than 2 values."""
    n1, n2 = len(a), len(b)
    if n1 < 2 or n2 < 2:
        return None
    ranks, ties = _ranks([*a, *b])
    u = sum(ranks[:n1]) - n1 * (n1 + 1) / 2
    n = n1 + n2
    variance = n1 * n2 / 12 * ((n + 1) - ties / (n * (n - 1)))
    if variance <= 0:  # every value equal: no evidence of a difference
        return {"u": u, "z": 0.0, "p_value": 1.0}
    z = (u - n1 * n2 / 2) / math.sqrt(variance)
    return {"u": u, "z": z, "p_value": math.erfc(abs(z) / math.sqrt(2))}
