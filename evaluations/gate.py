"""The static post-eval gate `paired_wilson_v1` (spec §4.11, evidence fields §1.1). Pure module:
standard library and `evaluations.statistics` only (no Django, no torch, no ninja).

    result = paired_wilson_v1(baseline=GateArm(...), candidate=GateArm(...), eval_job_id="...",
                              min_accuracy=0.8)
    result.decision        # promoted | regression | demoted | inconclusive | error
    result.evidence        # the PostEvalGateEvidence dict (+ "reason")
    final_outcome(result.decision, auto_load)   # promoted -> kept when auto_load is false

The candidate is compared with the adapter that was active before training (or the base model).
Each arm gives its per-example outcomes keyed by example id; `pass` counts 1 and every other kind
(`fail`, `invalid`, `error`) counts 0. A pair is improved when the candidate passes and the
baseline does not, regressed in the opposite case, tied otherwise; except that a baseline `error`
(a refused request, a crashed scorer) measured nothing of the baseline, so a candidate pass there is
tied, never improved: infrastructure failures on the side the candidate would replace are no evidence
for promoting it (the reason counts them). Accuracies and their 95 %
Wilson bounds are over the paired examples. The exact two-sided sign test runs on improved vs
regressed (ties dropped).

Decision, first rule that applies:
1. `error`: the arms disagree on the suite name, suite hash, effective generation hash or
   aggregation, or on the set of example ids (with one suite hash both arms must score the same
   examples; a missing example means an eval went wrong, and the gate fails closed), or an outcome
   is not one of pass/fail/invalid/error.
2. `inconclusive`: fewer than MIN_PAIRED_EXAMPLES (20) paired examples.
3. `regression`: regressed > improved and p < ALPHA (0.05): significantly worse.
4. `demoted`: the candidate's Wilson upper bound < min_accuracy: significantly below the floor.
5. `inconclusive`: the candidate's Wilson lower bound < min_accuracy: the floor is not proven.
6. `promoted`: improved > regressed and p < ALPHA: significant paired improvement, with the floor
   proven by rule 5.
7. `inconclusive`: otherwise (no significant improvement).

Reading of §4.11 ("exact sign test at α = 0.05 and 95 % Wilson lower bound ≥ min_accuracy"): both
are conditions for promotion, so the sign test must pass (a significant improvement), not merely
fail to show a regression. A candidate that is no better than the adapter it would replace, even
one above the floor, is `inconclusive` and is not served; that is also the versioned reference
policy ("the candidate must show significant paired improvement and its 95 % Wilson lower bound
must reach min_accuracy"), and the environment gate's rule (6) in the same section.

`promoted` here means the evidence passed; the caller maps it to `kept` when `auto_load` is false
(`final_outcome`) and records that in the evidence with `finalize_evidence`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from evaluations.statistics import Z_95, sign_test, wilson_interval

POLICY_VERSION = "paired_wilson_v1"
SUITE_POLICY = "single_versioned_suite"
MIN_PAIRED_EXAMPLES = 20
ALPHA = 0.05
CONFIDENCE_LEVEL = 0.95
DECISIONS = ("promoted", "regression", "demoted", "inconclusive", "error")
GATE_OUTCOMES = ("promoted", "kept", "regression", "demoted", "inconclusive", "error")
OUTCOME_KINDS = ("pass", "fail", "invalid", "error")
EVIDENCE_FIELDS = (
    "policy_version", "suite_policy", "eval_job_id", "suite_name", "suite_hash", "effective_generation_hash",
    "baseline_adapter", "candidate_adapter", "aggregation", "minimum_paired_examples", "paired_examples",
    "improved", "regressed", "tied", "exact_sign_test_p_value", "exact_sign_test_alpha", "baseline_accuracy",
    "baseline_accuracy_lower_bound", "baseline_accuracy_upper_bound", "candidate_accuracy",
    "candidate_accuracy_lower_bound", "candidate_accuracy_upper_bound", "accuracy_confidence_level",
    "minimum_accuracy", "outcome",
)


@dataclass(frozen=True)
class GateArm:
    """One side of the comparison: an eval of one suite with one generation setting."""

    adapter: str | None  # None (or "base") for the base model
    suite_name: str
    suite_hash: str
    effective_generation_hash: str
    outcomes: Mapping[str, object]  # example id -> "pass" | "fail" | "invalid" | "error" (or an object with .kind)
    aggregation: str = "single"


@dataclass(frozen=True)
class GateResult:
    decision: str  # one of DECISIONS
    reason: str  # for a person
    evidence: dict  # EVIDENCE_FIELDS + "reason"; evidence["outcome"] == decision


def _kind(value) -> str | None:
    kind = getattr(value, "kind", value)
    return kind if isinstance(kind, str) and kind in OUTCOME_KINDS else None


def _mismatch(baseline: GateArm, candidate: GateArm) -> str | None:
    for attribute, label in (("suite_name", "suite name"), ("suite_hash", "suite hash"),
                             ("effective_generation_hash", "effective generation hash"),
                             ("aggregation", "aggregation")):
        left, right = getattr(baseline, attribute), getattr(candidate, attribute)
        if left != right:
            return f"{label} differs: baseline {left!r}, candidate {right!r}"
    only_baseline = sorted(set(baseline.outcomes) - set(candidate.outcomes))
    only_candidate = sorted(set(candidate.outcomes) - set(baseline.outcomes))
    if only_baseline or only_candidate:
        parts = []
        if only_baseline:
            parts.append(f"{len(only_baseline)} only in the baseline (first {only_baseline[0]!r})")
        if only_candidate:
            parts.append(f"{len(only_candidate)} only in the candidate (first {only_candidate[0]!r})")
        return "the arms scored different examples: " + "; ".join(parts)
    for side, arm in (("baseline", baseline), ("candidate", candidate)):
        for example_id, value in arm.outcomes.items():
            if _kind(value) is None:
                return f"{side} example {example_id!r} has outcome {getattr(value, 'kind', value)!r}, not one of " \
                       f"{', '.join(OUTCOME_KINDS)}"
    return None


def _check_min_accuracy(min_accuracy) -> float:
    if isinstance(min_accuracy, bool) or not isinstance(min_accuracy, int | float) \
            or not math.isfinite(min_accuracy) or not 0 <= min_accuracy <= 1:
        raise ValueError(f"min_accuracy must be a number in [0, 1], got {min_accuracy!r}")
    return float(min_accuracy)


def paired_wilson_v1(*, baseline: GateArm, candidate: GateArm, eval_job_id: str, min_accuracy: float,
                     candidate_adapter: str | None = None) -> GateResult:
    """Apply the gate. `candidate_adapter` defaults to candidate.adapter (the trained adapter's name)."""
    floor = _check_min_accuracy(min_accuracy)
    mismatch = _mismatch(baseline, candidate)
    ids = sorted(set(baseline.outcomes) & set(candidate.outcomes))
    base_pass = cand_pass = improved = regressed = baseline_errors = 0
    for example_id in ids:
        base_kind = _kind(baseline.outcomes[example_id])
        b = base_kind == "pass"
        c = _kind(candidate.outcomes[example_id]) == "pass"
        base_pass += b
        cand_pass += c
        baseline_errors += base_kind == "error"
        improved += c and not b and base_kind != "error"
        regressed += b and not c
    n = len(ids)
    tied = n - improved - regressed
    p_value = sign_test(improved, regressed)
    base_low, base_high = wilson_interval(base_pass, n, z=Z_95)
    cand_low, cand_high = wilson_interval(cand_pass, n, z=Z_95)
    counts = f"improved {improved}, regressed {regressed}, tied {tied}, exact two-sided p={p_value:.6g}"
    if baseline_errors:
        counts += f"; {baseline_errors} baseline errors counted as ties"

    if mismatch is not None:
        decision, reason = "error", f"the arms cannot be paired: {mismatch}"
    elif n < MIN_PAIRED_EXAMPLES:
        decision, reason = "inconclusive", (f"only {n} paired examples; {POLICY_VERSION} needs at least "
                                            f"{MIN_PAIRED_EXAMPLES}")
    elif regressed > improved and p_value < ALPHA:
        decision, reason = "regression", f"the candidate is significantly worse than the baseline ({counts})"
    elif cand_high < floor:
        decision, reason = "demoted", (f"the candidate's 95% Wilson upper bound {cand_high:.3f} is below the "
                                       f"accuracy floor {floor:.3f} ({cand_pass}/{n} passed)")
    elif cand_low < floor:
        decision, reason = "inconclusive", (f"the candidate's 95% Wilson lower bound {cand_low:.3f} does not "
                                            f"reach the accuracy floor {floor:.3f} ({cand_pass}/{n} passed)")
    elif improved > regressed and p_value < ALPHA:
        decision, reason = "promoted", (f"significant paired improvement ({counts}) and the 95% Wilson lower "
                                        f"bound {cand_low:.3f} reaches the floor {floor:.3f}")
    else:
        decision, reason = "inconclusive", f"no significant paired improvement over the baseline ({counts})"

    evidence = {
        "policy_version": POLICY_VERSION,
        "suite_policy": SUITE_POLICY,
        "eval_job_id": eval_job_id,
        "suite_name": candidate.suite_name,
        "suite_hash": candidate.suite_hash,
        "effective_generation_hash": candidate.effective_generation_hash,
        "baseline_adapter": None if baseline.adapter in (None, "", "base") else baseline.adapter,
        "candidate_adapter": candidate_adapter if candidate_adapter is not None else candidate.adapter,
        "aggregation": candidate.aggregation,
        "minimum_paired_examples": MIN_PAIRED_EXAMPLES,
        "paired_examples": n,
        "improved": improved,
        "regressed": regressed,
        "tied": tied,
        "exact_sign_test_p_value": p_value,
        "exact_sign_test_alpha": ALPHA,
        "baseline_accuracy": base_pass / n if n else 0.0,
        "baseline_accuracy_lower_bound": base_low,
        "baseline_accuracy_upper_bound": base_high,
        "candidate_accuracy": cand_pass / n if n else 0.0,
        "candidate_accuracy_lower_bound": cand_low,
        "candidate_accuracy_upper_bound": cand_high,
        "accuracy_confidence_level": CONFIDENCE_LEVEL,
        "minimum_accuracy": floor,
        "outcome": decision,
        "reason": reason,
    }
    return GateResult(decision, reason, evidence)


def final_outcome(decision: str, auto_load: bool) -> str:
    """The recorded `gate_outcome`: a passed gate is `promoted` with auto_load, `kept` without."""
    if decision not in DECISIONS:
        raise ValueError(f"decision must be one of {', '.join(DECISIONS)}, got {decision!r}")
    return "kept" if decision == "promoted" and not auto_load else decision


def finalize_evidence(evidence: dict, auto_load: bool) -> dict:
    """A copy of the evidence with `outcome` set to final_outcome(its decision, auto_load)."""
    return {**evidence, "outcome": final_outcome(evidence["outcome"], auto_load)}
