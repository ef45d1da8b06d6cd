"""paired_wilson_v1: every decision branch, with hand-computed p-values and Wilson bounds."""

from __future__ import annotations

import math

import pytest

from evaluations.example_scorers import ExampleOutcome
from evaluations.gate import (
    EVIDENCE_FIELDS,
    GateArm,
    final_outcome,
    finalize_evidence,
    paired_wilson_v1,
)

Z = 1.959963984540054


def wilson(k: int, n: int) -> tuple[float, float]:
    """The Wilson score interval written out independently of evaluations.statistics."""
    p = k / n
    centre = p + Z * Z / (2 * n)
    spread = Z * math.sqrt(p * (1 - p) / n + Z * Z / (4 * n * n))
    return (centre - spread) / (1 + Z * Z / n), (centre + spread) / (1 + Z * Z / n)


def arms(pairs, *, suite_hash=("sha256:s", "sha256:s"), generation=("sha256:g", "sha256:g"),
         names=("suite", "suite"), aggregation=("single", "single")):
    """pairs: [(baseline passed, candidate passed)] -> (baseline arm, candidate arm)."""
    base = {f"ex-{i:03d}": ("pass" if b else "fail") for i, (b, _) in enumerate(pairs)}
    cand = {f"ex-{i:03d}": ("pass" if c else "invalid") for i, (_, c) in enumerate(pairs)}
    return (GateArm("math-r000", names[0], suite_hash[0], generation[0], base, aggregation[0]),
            GateArm("math-r001", names[1], suite_hash[1], generation[1], cand, aggregation[1]))


def pairs(both=0, improved=0, regressed=0, neither=0):
    return [(1, 1)] * both + [(0, 1)] * improved + [(1, 0)] * regressed + [(0, 0)] * neither


def gate(p, min_accuracy=0.5, **kw):
    baseline, candidate = arms(p, **kw)
    return paired_wilson_v1(baseline=baseline, candidate=candidate, eval_job_id="job-7", min_accuracy=min_accuracy)


def test_evidence_has_exactly_the_spec_fields_plus_reason():
    spec_fields = (  # spec §1.1 PostEvalGateEvidence, optional recovery/gain fields not produced
        "policy_version suite_policy eval_job_id suite_name suite_hash effective_generation_hash baseline_adapter "
        "candidate_adapter aggregation minimum_paired_examples paired_examples improved regressed tied "
        "exact_sign_test_p_value exact_sign_test_alpha baseline_accuracy baseline_accuracy_lower_bound "
        "baseline_accuracy_upper_bound candidate_accuracy candidate_accuracy_lower_bound "
        "candidate_accuracy_upper_bound accuracy_confidence_level minimum_accuracy outcome").split()
    assert list(EVIDENCE_FIELDS) == spec_fields
    result = gate(pairs(improved=20))
    assert list(result.evidence) == spec_fields + ["reason"]
    assert result.evidence["reason"] == result.reason


def test_twenty_improvements_promote_with_hand_computed_values():
    result = gate(pairs(improved=20), min_accuracy=0.8)
    e = result.evidence
    assert result.decision == "promoted" and e["outcome"] == "promoted"
    assert e["exact_sign_test_p_value"] == pytest.approx(1.9073486328125e-6, rel=1e-12)  # 2 * 0.5**20
    assert e["exact_sign_test_p_value"] == pytest.approx(1.9073e-6, rel=1e-4)
    assert (e["paired_examples"], e["improved"], e["regressed"], e["tied"]) == (20, 20, 0, 0)
    assert e["candidate_accuracy"] == 1.0 and e["baseline_accuracy"] == 0.0
    # 20/20: lower = n / (n + z^2) = 20 / 23.8414588... = 0.838874
    assert e["candidate_accuracy_lower_bound"] == pytest.approx(20 / (20 + Z * Z), rel=1e-12)
    assert e["candidate_accuracy_lower_bound"] == pytest.approx(0.838874, abs=1e-6)
    assert e["candidate_accuracy_upper_bound"] == pytest.approx(1.0)
    assert e["baseline_accuracy_lower_bound"] == pytest.approx(0.0, abs=1e-12)
    assert e["baseline_accuracy_upper_bound"] == pytest.approx(Z * Z / (20 + Z * Z), rel=1e-12)
    assert e | {"exact_sign_test_p_value": 0} == e | {
        "policy_version": "paired_wilson_v1", "suite_policy": "single_versioned_suite", "eval_job_id": "job-7",
        "suite_name": "suite", "suite_hash": "sha256:s", "effective_generation_hash": "sha256:g",
        "baseline_adapter": "math-r000", "candidate_adapter": "math-r001", "aggregation": "single",
        "minimum_paired_examples": 20, "exact_sign_test_alpha": 0.05, "accuracy_confidence_level": 0.95,
        "minimum_accuracy": 0.8, "exact_sign_test_p_value": 0}
    assert "significant paired improvement" in result.reason


def test_fifteen_of_twenty_wilson_bounds():
    # 15/20 = 0.75: Wilson 95 % interval 0.531299 .. 0.888138 (computed by hand from the formula)
    result = gate(pairs(both=5, improved=10, neither=5), min_accuracy=0.5)
    e = result.evidence
    low, high = wilson(15, 20)
    assert (low, high) == pytest.approx((0.531299, 0.888138), abs=1e-6)
    assert e["candidate_accuracy"] == 0.75
    assert e["candidate_accuracy_lower_bound"] == pytest.approx(low, rel=1e-12)
    assert e["candidate_accuracy_upper_bound"] == pytest.approx(high, rel=1e-12)
    assert e["baseline_accuracy"] == 0.25
    assert (e["baseline_accuracy_lower_bound"], e["baseline_accuracy_upper_bound"]) == pytest.approx(
        (1 - high, 1 - low), rel=1e-9)  # 5/20 mirrors 15/20
    assert e["exact_sign_test_p_value"] == 2 / 1024  # 10 improved, 0 regressed
    assert result.decision == "promoted"


def test_hash_or_suite_mismatch_is_error():
    p = pairs(improved=25)
    for kw, word in [({"suite_hash": ("sha256:a", "sha256:b")}, "suite hash"),
                     ({"generation": ("sha256:a", "sha256:b")}, "effective generation hash"),
                     ({"names": ("one", "two")}, "suite name"),
                     ({"aggregation": ("single", "mean_of_3")}, "aggregation")]:
        result = gate(p, **kw)
        assert result.decision == "error" and result.evidence["outcome"] == "error"
        assert word in result.reason


def test_different_example_sets_are_error():
    baseline, candidate = arms(pairs(improved=25))
    candidate = GateArm(candidate.adapter, candidate.suite_name, candidate.suite_hash,
                        candidate.effective_generation_hash,
                        {k: v for k, v in candidate.outcomes.items() if k != "ex-003"} | {"ex-new": "pass"})
    result = paired_wilson_v1(baseline=baseline, candidate=candidate, eval_job_id="j", min_accuracy=0.5)
    assert result.decision == "error"
    assert "'ex-003'" in result.reason and "'ex-new'" in result.reason
    assert result.evidence["paired_examples"] == 24  # the evidence still counts what paired


def test_unknown_outcome_kind_is_error():
    baseline, candidate = arms(pairs(improved=25))
    candidate = GateArm(candidate.adapter, candidate.suite_name, candidate.suite_hash,
                        candidate.effective_generation_hash, {**candidate.outcomes, "ex-000": "skipped"})
    result = paired_wilson_v1(baseline=baseline, candidate=candidate, eval_job_id="j", min_accuracy=0.5)
    assert result.decision == "error" and "'skipped'" in result.reason


def test_fewer_than_twenty_pairs_is_inconclusive():
    result = gate(pairs(improved=19), min_accuracy=0.0)
    assert result.decision == "inconclusive" and "only 19 paired examples" in result.reason
    assert result.evidence["exact_sign_test_p_value"] == pytest.approx(2 * 0.5**19)


def test_empty_arms_are_inconclusive_with_vacuous_bounds():
    result = gate([], min_accuracy=0.5)
    e = result.evidence
    assert result.decision == "inconclusive" and e["paired_examples"] == 0
    assert (e["candidate_accuracy"], e["candidate_accuracy_lower_bound"], e["candidate_accuracy_upper_bound"]) \
        == (0.0, 0.0, 1.0)
    assert e["exact_sign_test_p_value"] == 1.0


def test_significant_regression():
    result = gate(pairs(regressed=20), min_accuracy=0.0)
    assert result.decision == "regression" and "significantly worse" in result.reason
    assert result.evidence["exact_sign_test_p_value"] == pytest.approx(1.9073486328125e-6)
    # regression is checked before the floor: this candidate is also far below 0.9
    assert gate(pairs(regressed=20), min_accuracy=0.9).decision == "regression"


def test_regression_needs_significance():
    # 5 regressed, 0 improved: p = 2 / 32 = 0.0625 >= 0.05, so not a regression; 6-0 gives 0.03125
    assert gate(pairs(both=15, regressed=5), min_accuracy=0.0).decision == "inconclusive"
    assert gate(pairs(both=14, regressed=6), min_accuracy=0.0).decision == "regression"


def test_demoted_when_upper_bound_is_below_the_floor():
    # candidate 1/20: Wilson upper = 0.236 < 0.5; baseline 2/20, 1 regressed: not significant
    result = gate(pairs(both=1, regressed=1, neither=18), min_accuracy=0.5)
    low, high = wilson(1, 20)
    assert result.evidence["candidate_accuracy_upper_bound"] == pytest.approx(high)
    assert high == pytest.approx(0.236131, abs=1e-6)
    assert result.decision == "demoted" and "upper bound 0.236" in result.reason
    # 15/20 significantly improved but upper 0.888 < 0.9: demoted all the same
    assert gate(pairs(both=5, improved=10, neither=5), min_accuracy=0.9).decision == "demoted"


def test_inconclusive_when_lower_bound_misses_the_floor():
    result = gate(pairs(both=5, improved=10, neither=5), min_accuracy=0.6)  # lower 0.531 < 0.6 <= upper
    assert result.decision == "inconclusive" and "lower bound 0.531" in result.reason


def test_lower_bound_equal_to_the_floor_passes():
    low, _ = wilson(15, 20)
    assert gate(pairs(both=5, improved=10, neither=5), min_accuracy=low).decision == "promoted"
    assert gate(pairs(both=5, improved=10, neither=5), min_accuracy=low + 1e-9).decision == "inconclusive"


def test_above_the_floor_without_significant_improvement_is_inconclusive():
    # same accuracy (18/20 both, all tied): lower bound 0.699 >= 0.5, but p = 1
    result = gate(pairs(both=18, neither=2), min_accuracy=0.5)
    assert result.decision == "inconclusive" and "no significant paired improvement" in result.reason
    # slightly worse but not significantly (0 improved, 1 regressed) and above the floor: not promoted
    assert gate(pairs(both=18, regressed=1, neither=1), min_accuracy=0.5).decision == "inconclusive"
    # 5-0 improvement is p = 0.0625: still not significant; 6-0 is
    assert gate(pairs(both=12, improved=5, neither=3), min_accuracy=0.5).decision == "inconclusive"
    assert gate(pairs(both=12, improved=6, neither=2), min_accuracy=0.5).decision == "promoted"


def test_outcome_objects_and_non_pass_kinds():
    # invalid and error count as 0 like fail
    base = {f"e{i}": ExampleOutcome("error" if i % 2 else "fail", "") for i in range(20)}
    cand = {f"e{i}": ExampleOutcome("pass", "") for i in range(20)}
    result = paired_wilson_v1(baseline=GateArm(None, "s", "h", "g", base), candidate=GateArm("c", "s", "h", "g", cand),
                              eval_job_id="j", min_accuracy=0.8)
    # a baseline error (a refused request, a crashed scorer) measured nothing: tied, never improved (QA)
    e = result.evidence
    assert (e["improved"], e["regressed"], e["tied"], e["baseline_accuracy"]) == (10, 0, 10, 0.0)
    assert e["exact_sign_test_p_value"] == pytest.approx(2 / 2**10)
    assert result.decision == "promoted" and "10 baseline errors counted as ties" in result.reason
    assert result.evidence["baseline_adapter"] is None  # the base model
    # a baseline that only errored is no evidence at all for the candidate
    errors = {key: ExampleOutcome("error", "request refused") for key in base}
    alone = paired_wilson_v1(baseline=GateArm(None, "s", "h", "g", errors), candidate=GateArm("c", "s", "h", "g", cand),
                             eval_job_id="j", min_accuracy=0.8)
    assert alone.decision == "inconclusive" and alone.evidence["improved"] == 0 and alone.evidence["tied"] == 20
    # a candidate error still counts against the candidate: regressed where the baseline passed
    passes = {key: ExampleOutcome("pass", "") for key in base}
    worse = paired_wilson_v1(baseline=GateArm(None, "s", "h", "g", passes), candidate=GateArm("c", "s", "h", "g", errors),
                             eval_job_id="j", min_accuracy=0.8)
    assert worse.decision == "regression" and worse.evidence["regressed"] == 20


def test_base_label_and_candidate_name_override():
    baseline, candidate = arms(pairs(improved=20))
    baseline = GateArm("base", *[getattr(baseline, f) for f in ("suite_name", "suite_hash",
                                                                 "effective_generation_hash", "outcomes")])
    result = paired_wilson_v1(baseline=baseline, candidate=candidate, eval_job_id="j", min_accuracy=0.5,
                              candidate_adapter="math-r001-final")
    assert result.evidence["baseline_adapter"] is None
    assert result.evidence["candidate_adapter"] == "math-r001-final"


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan"), True, "0.5", None])
def test_min_accuracy_is_checked(bad):
    with pytest.raises(ValueError):
        gate(pairs(improved=20), min_accuracy=bad)


def test_final_outcome_and_finalize_evidence():
    assert final_outcome("promoted", True) == "promoted"
    assert final_outcome("promoted", False) == "kept"
    for decision in ("regression", "demoted", "inconclusive", "error"):
        assert final_outcome(decision, False) == decision == final_outcome(decision, True)
    with pytest.raises(ValueError):
        final_outcome("passed", True)
    evidence = gate(pairs(improved=20)).evidence
    kept = finalize_evidence(evidence, auto_load=False)
    assert kept["outcome"] == "kept" and evidence["outcome"] == "promoted"  # a copy
    assert finalize_evidence(evidence, auto_load=True)["outcome"] == "promoted"


def test_an_all_pass_candidate_meets_a_floor_of_one():
    # 25/25 passed: the Wilson upper bound is exactly 1 (floats gave 0.9999999999999999, which demoted
    # and renamed the adapter `.failed` under min_accuracy 1.0).
    result = gate(pairs(improved=25), min_accuracy=1.0)
    assert result.decision != "demoted"
    assert result.evidence["candidate_accuracy_upper_bound"] == 1.0
