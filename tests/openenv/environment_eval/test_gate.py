"""`paired_return_sign_test_v1` (openenv.environment_gate) against exact binomial values computed here
independently, and the decision rules of reference-spec §4.11 in their order."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openenv.environment_gate import (
    MIN_PAIRED_GROUPS,
    EnvironmentGateError,
    GateThresholds,
    GroupReturns,
    final_outcome,
    group_returns_of,
    outcome_consistent,
    paired_return_sign_test_v1,
    sign_test_p_value,
)


def reference_p(improved: int, regressed: int) -> Fraction:
    """Two-sided exact binomial p by the 'as or less likely' rule: the mass of every outcome x of
    Binomial(n, 1/2) whose probability is at most that of the observed count (no doubling, no min)."""
    n = improved + regressed
    observed = math.comb(n, improved)
    return Fraction(sum(math.comb(n, x) for x in range(n + 1) if math.comb(n, x) <= observed), 2**n)


def sides(pairs, *, size=1, seed_start=1000):
    """pairs: [(baseline return, candidate return)] -> the two sides, one group per pair."""
    baseline = [GroupReturns(i, seed_start + i, (b,) * size) for i, (b, _) in enumerate(pairs)]
    candidate = [GroupReturns(i, seed_start + i, (c,) * size) for i, (_, c) in enumerate(pairs)]
    return baseline, candidate


NO_MARGIN = GateThresholds()


def gate(pairs, thresholds=NO_MARGIN, **kwargs):
    baseline, candidate = sides(pairs, **kwargs)
    return paired_return_sign_test_v1(baseline=baseline, candidate=candidate, gate=thresholds)


# --- the exact sign test ------------------------------------------------------------------------

@pytest.mark.parametrize("improved, regressed", [(20, 0), (0, 20), (15, 5), (14, 6), (10, 10), (1, 0), (0, 0),
                                                 (30, 11), (3, 17), (100, 70)])
def test_p_value_is_the_exact_binomial_value(improved, regressed):
    p = sign_test_p_value(improved, regressed)
    assert isinstance(p, Fraction)
    assert p == reference_p(improved, regressed)


def test_twenty_to_nothing_is_the_spec_value():
    p = sign_test_p_value(20, 0)
    assert p == Fraction(2, 2**20) == Fraction(1, 524288)
    assert f"{float(p):.4e}" == "1.9073e-06"


def test_no_pairs_and_balanced_pairs_give_one():
    assert sign_test_p_value(0, 0) == 1
    assert sign_test_p_value(7, 7) == 1


@given(st.integers(0, 60), st.integers(0, 60))
def test_p_value_properties(improved, regressed):
    p = sign_test_p_value(improved, regressed)
    assert p == reference_p(improved, regressed)
    assert 0 < p <= 1
    assert p == sign_test_p_value(regressed, improved)  # two-sided: symmetric
    if improved > regressed:  # one more win on the winning side is stronger evidence
        assert sign_test_p_value(improved + 1, regressed) < p


@pytest.mark.parametrize("bad", [(-1, 3), (True, 2), (1.0, 2)])
def test_p_value_refuses_non_counts(bad):
    with pytest.raises(ValueError):
        sign_test_p_value(*bad)


# --- the decision rules -------------------------------------------------------------------------

def test_all_improved_passes_with_the_exact_p():
    result = gate([(0.0, 1.0)] * 20)
    assert result.decision == "passed"
    e = result.evidence
    assert (e["improved_groups"], e["regressed_groups"], e["tied_groups"]) == (20, 0, 0)
    assert e["exact_sign_test_p_value"] == float(Fraction(1, 524288))
    assert e["exact_sign_test_p_value_rational"] == "1/524288"
    assert e["policy_version"] == "paired_return_sign_test_v1" and e["minimum_paired_groups"] == 20
    assert e["paired_groups"] == 20 and e["paired_episodes"] == 20 and e["decision"] == "passed"
    assert e["baseline_mean_return"] == 0.0 and e["candidate_mean_return"] == 1.0
    assert e["mean_return_improvement"] == 1.0 and e["exact_sign_test_alpha"] == 0.05


def test_ties_are_dropped_from_the_test():
    result = gate([(0.0, 1.0)] * 15 + [(2.0, 2.0)] * 10)
    e = result.evidence
    assert (e["improved_groups"], e["regressed_groups"], e["tied_groups"]) == (15, 0, 10)
    assert result.p_value == Fraction(2, 2**15) == reference_p(15, 0)
    assert result.decision == "passed"


def test_all_ties_are_inconclusive():
    result = gate([(1.5, 1.5)] * 25)
    assert result.decision == "inconclusive"
    assert result.p_value == 1 and result.evidence["tied_groups"] == 25


def test_all_ties_with_a_positive_margin_are_rejected_by_rule_five():
    result = gate([(1.5, 1.5)] * 25, GateThresholds(min_mean_improvement=0.05))
    assert result.decision == "rejected" and "min_mean_improvement" in result.reason


def test_fewer_than_twenty_groups_is_inconclusive_even_when_every_group_improved():
    result = gate([(0.0, 3.0)] * (MIN_PAIRED_GROUPS - 1))
    assert result.decision == "inconclusive"
    assert "19 paired seed groups" in result.reason
    assert result.p_value == Fraction(2, 2**19)


def test_all_regressed_is_rejected():
    result = gate([(1.0, 0.0)] * 20)
    assert result.decision == "rejected" and "significantly worse" in result.reason
    assert result.evidence["regressed_groups"] == 20 and result.p_value == Fraction(1, 524288)


def test_significant_regression_comes_before_the_thresholds():
    result = gate([(1.0, 0.0)] * 20, GateThresholds(min_mean_return=5.0))
    assert "significantly worse" in result.reason


def test_min_mean_return_rejects_a_significant_improvement():
    result = gate([(0.0, 1.0)] * 20, GateThresholds(min_mean_return=1.5))
    assert result.decision == "rejected" and "min_mean_return" in result.reason
    assert result.evidence["minimum_mean_return"] == 1.5


def test_min_mean_improvement_rejects_a_small_significant_improvement():
    result = gate([(0.0, 0.01)] * 20, GateThresholds(min_mean_improvement=0.05))
    assert result.decision == "rejected" and "min_mean_improvement" in result.reason
    assert result.evidence["minimum_mean_improvement"] == 0.05


def test_a_non_significant_mean_loss_is_rejected_by_the_default_margin():
    # 9 improved by 0.1, 11 regressed by 1: p > 0.05, mean improvement < 0 = the default margin
    result = gate([(0.0, 0.1)] * 9 + [(1.0, 0.0)] * 11)
    assert result.p_value > Fraction(1, 20)
    assert result.decision == "rejected" and "min_mean_improvement" in result.reason


def test_a_non_significant_gain_is_inconclusive():
    result = gate([(0.0, 1.0)] * 12 + [(1.0, 0.5)] * 8)
    assert result.p_value == reference_p(12, 8) > Fraction(1, 20)
    assert result.decision == "inconclusive"


def test_just_significant_and_just_not():
    # n = 20: 15-5 gives p = 0.0414 (< 0.05), 14-6 gives p = 0.1153
    assert gate([(0.0, 1.0)] * 15 + [(1.0, 0.9)] * 5).decision == "passed"
    assert gate([(0.0, 1.0)] * 14 + [(1.0, 0.9)] * 6).decision == "inconclusive"


def test_thresholds_compare_the_decimals_exactly():
    # baseline group means (0.1 + 0.2) / 2 = 0.15 exactly; candidate 0.3: improvement exactly 0.15 (the
    # float arithmetic 0.3 - 0.15000000000000002 would fall below the threshold)
    baseline = [GroupReturns(i, i, (0.1, 0.2)) for i in range(20)]
    candidate = [GroupReturns(i, i, (0.3, 0.3)) for i in range(20)]
    result = paired_return_sign_test_v1(baseline=baseline, candidate=candidate,
                                        gate=GateThresholds(min_mean_return=0.3, min_mean_improvement=0.15))
    assert result.baseline_mean == Fraction(3, 20) and result.candidate_mean == Fraction(3, 10)
    assert result.decision == "passed"


def test_group_means_decide_the_sign_not_single_episodes():
    baseline = [GroupReturns(i, i, (0.0, 2.0)) for i in range(20)]     # mean 1
    candidate = [GroupReturns(i, i, (1.0, 1.0)) for i in range(20)]    # mean 1: tied
    result = paired_return_sign_test_v1(baseline=baseline, candidate=candidate, gate=GateThresholds())
    assert result.evidence["tied_groups"] == 20 and result.evidence["paired_episodes"] == 40


def test_without_a_gate_the_result_is_diagnostic():
    baseline, candidate = sides([(0.0, 1.0)] * 20)
    result = paired_return_sign_test_v1(baseline=baseline, candidate=candidate, gate=None)
    assert result.decision == "diagnostic" and result.evidence["gated"] is False
    assert result.evidence["improved_groups"] == 20 and result.evidence["minimum_mean_improvement"] is None


@pytest.mark.parametrize("change", ["seed", "group", "episodes", "nan", "duplicate"])
def test_unpairable_sides_fail_closed(change):
    baseline, candidate = sides([(0.0, 1.0)] * 20)
    if change == "seed":
        candidate[3] = GroupReturns(3, 999_999, candidate[3].returns)
    elif change == "group":
        candidate = candidate[:-1]
    elif change == "episodes":
        candidate[0] = GroupReturns(0, candidate[0].seed, (1.0, 1.0))
    elif change == "nan":
        candidate[0] = GroupReturns(0, candidate[0].seed, (float("nan"),))
    else:
        candidate.append(candidate[0])
    with pytest.raises(EnvironmentGateError):
        paired_return_sign_test_v1(baseline=baseline, candidate=candidate, gate=GateThresholds())


@given(st.lists(st.tuples(st.integers(-5, 5), st.integers(-5, 5)), min_size=0, max_size=40))
def test_counts_and_decision_follow_the_rules(pairs):
    result = gate([(float(b), float(c)) for b, c in pairs])
    e = result.evidence
    improved, regressed = sum(c > b for b, c in pairs), sum(c < b for b, c in pairs)
    assert (e["improved_groups"], e["regressed_groups"]) == (improved, regressed)
    assert e["tied_groups"] == len(pairs) - improved - regressed
    assert result.p_value == reference_p(improved, regressed)
    mean_gain = Fraction(sum(c - b for b, c in pairs), len(pairs)) if pairs else Fraction(0)
    significant = result.p_value < Fraction(1, 20)
    if len(pairs) < 20:
        expected = "inconclusive"
    elif regressed > improved and significant:
        expected = "rejected"
    elif mean_gain < 0:
        expected = "rejected"
    elif improved > regressed and significant:
        expected = "passed"
    else:
        expected = "inconclusive"
    assert result.decision == expected


def test_outcomes():
    assert final_outcome("passed", True) == "promoted"
    assert final_outcome("passed", False) == "kept"
    for decision in ("rejected", "inconclusive", "diagnostic"):
        assert final_outcome(decision, True) == decision
    with pytest.raises(ValueError):
        final_outcome("promoted", True)
    assert outcome_consistent("passed", "error") and not outcome_consistent("rejected", "promoted")


def test_group_returns_from_a_summary():
    summary = {"rollouts": [
        {"group_index": 1, "candidate_index": 1, "seed": 11, "episode_return": 2.0},
        {"group_index": 0, "candidate_index": 0, "seed": 10, "episode_return": -1},
        {"group_index": 1, "candidate_index": 0, "seed": 11, "episode_return": 1.5}]}
    assert group_returns_of(summary) == [GroupReturns(0, 10, (-1,)), GroupReturns(1, 11, (1.5, 2.0))]
    with pytest.raises(EnvironmentGateError):
        group_returns_of({"rollouts": [{"group_index": 0}]})
