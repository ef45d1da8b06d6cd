"""Exact paired statistics for gates and learning checks. Pure module: math only.

- `sign_test(wins, losses)`: the exact sign test on paired outcomes (ties dropped), two-sided or
  one-sided ("greater": wins exceed losses). 20 wins and 0 losses give p = 2 * 0.5**20 = 1.9073e-6.
- `wilson_interval(successes, n)`: the Wilson score interval (95 % by default).
"""

from __future__ import annotations

import math

Z_95 = 1.959963984540054


def _binomial_upper_tail(k: int, n: int) -> float:
    """P(X >= k) for X ~ Binomial(n, 1/2), exactly (integers until the final division)."""
    if k <= 0:
        return 1.0
    if k > n:
        return 0.0
    return sum(math.comb(n, i) for i in range(k, n + 1)) / 2**n


def sign_test(wins: int, losses: int, *, alternative: str = "two-sided") -> float:
    """Exact sign-test p-value for `wins` pairs better and `losses` pairs worse (ties excluded)."""
    if wins < 0 or losses < 0:
        raise ValueError("wins and losses must be non-negative")
    n = wins + losses
    if n == 0:
        return 1.0
    if alternative == "greater":
        return _binomial_upper_tail(wins, n)
    if alternative == "less":
        return _binomial_upper_tail(losses, n)
    if alternative != "two-sided":
        raise ValueError("alternative must be 'two-sided', 'greater' or 'less'")
    return min(1.0, 2 * _binomial_upper_tail(max(wins, losses), n))


def wilson_interval(successes: int, n: int, *, z: float = Z_95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion; (0, 1) when n is 0."""
    if n < 0 or not 0 <= successes <= n:
        raise ValueError("need 0 <= successes <= n")
    if n == 0:
        return 0.0, 1.0
    p = successes / n
    denominator = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denominator
    # At the ends the true bound is exactly 0 or 1; in floats centre -/+ half misses it by an ulp, which
    # would put an all-pass candidate's upper bound (0.9999999999999999) below a floor of 1.0.
    low = 0.0 if successes == 0 else max(0.0, centre - half)
    high = 1.0 if successes == n else min(1.0, centre + half)
    return low, high
