"""Exact sign test and Wilson bounds against hand-computed values."""

from __future__ import annotations

import math

import pytest

from evaluations.statistics import sign_test, wilson_interval


def test_sign_test_hand_computed_values():
    assert sign_test(20, 0) == pytest.approx(1.9073486328125e-6, rel=1e-12)  # 2 * 0.5**20
    assert sign_test(0, 20) == sign_test(20, 0)
    assert sign_test(20, 0, alternative="greater") == 0.5**20
    assert sign_test(0, 20, alternative="greater") == 1.0
    # 8 wins, 2 losses: P(X >= 8 | n=10) = (45 + 10 + 1) / 1024
    assert sign_test(8, 2, alternative="greater") == 56 / 1024
    assert sign_test(8, 2) == 112 / 1024
    assert sign_test(5, 5) == 1.0 and sign_test(0, 0) == 1.0
    assert sign_test(2, 8, alternative="less") == 56 / 1024


def test_sign_test_rejects_bad_input():
    with pytest.raises(ValueError):
        sign_test(-1, 3)
    with pytest.raises(ValueError):
        sign_test(1, 3, alternative="sideways")


def test_wilson_interval_hand_computed():
    z = 1.959963984540054
    low, high = wilson_interval(15, 20)
    p, n = 0.75, 20
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    assert (low, high) == pytest.approx((centre - half, centre + half))
    assert (round(low, 4), round(high, 4)) == (0.5313, 0.8881)
    assert wilson_interval(0, 0) == (0.0, 1.0)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == pytest.approx(1.0)


@pytest.mark.parametrize("n", [1, 3, 10, 13, 25, 27, 28, 30, 1999])
def test_wilson_bounds_are_exact_at_the_ends(n):
    # In floats centre + half rounds to 0.9999999999999999 for many n (25 among them); the true bound
    # is 1, and a gate floor of 1.0 must not see an all-pass candidate's upper bound below it.
    assert wilson_interval(n, n)[1] == 1.0
    assert wilson_interval(0, n)[0] == 0.0

