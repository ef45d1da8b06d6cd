"""The environment gate `paired_return_sign_test_v1` (reference-spec §4.11, evidence §2.8). Pure module:
the standard library only (no Django, no ORM, no torch; import-linter checks it).

    result = paired_return_sign_test_v1(baseline=[GroupReturns(0, 120, (1.0,)), ...], candidate=[...],
                                        gate=GateThresholds(min_mean_improvement=0.05))
    result.decision        # diagnostic | passed | rejected | inconclusive
    result.evidence        # the `evidence` block of kiln.openenv-environment-evaluation.v1
    final_outcome(result.decision, auto_load)   # passed -> promoted (auto_load) or kept

Pairing: one pair per seed group (the same group index and seed on both sides; the eval collects
both sides on one plan, so any other shape is refused with `EnvironmentGateError`: the gate fails
closed). Each side's unit is the group's mean episode return; a pair is improved when the
candidate's mean is greater, regressed when smaller, tied when equal (ties are dropped from the
test). Overall means are the means of the per-group means (equal group sizes: the episode means).

Exactness: every return and threshold is read as the exact decimal its JSON text spells (Python's
shortest round-trip `repr` of the float, the form the summary artifact stores), and every mean,
difference, comparison and the p-value are exact rationals (`fractions.Fraction`); floats appear only
in the evidence, for display. So `0.1 + 0.2` in a group mean compares equal to a `0.3` threshold
the way a person reads it, and the decision can be recomputed from the published artifacts alone.

Exact two-sided sign test on improved vs regressed: n = improved + regressed, k = min of the two,
p = min(1, 2 * sum_{i <= k} C(n, i) / 2^n) (integers to the final rational; n = 0 gives p = 1;
20-0 gives 2/2^20 = 1.9073e-6).

Decision, first rule that applies (§4.11):
1. no gate configured: `diagnostic` (the counts, means and p are still reported);
2. fewer than MIN_PAIRED_GROUPS (20) paired seed groups: `inconclusive`;
3. regressed > improved and p < ALPHA (0.05): `rejected` (significantly worse);
4. `min_mean_return` set and the candidate's mean return < it: `rejected`;
5. mean improvement (candidate mean - baseline mean) < `min_mean_improvement` (default 0): `rejected`;
6. improved > regressed and p < ALPHA: `passed`;
7. otherwise `inconclusive` (no significant improvement).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from fractions import Fraction

POLICY_VERSION = "paired_return_sign_test_v1"
MIN_PAIRED_GROUPS = 20
ALPHA = Fraction(1, 20)
DECISIONS = ("diagnostic", "passed", "rejected", "inconclusive")
OUTCOMES = ("diagnostic", "promoted", "kept", "rejected", "inconclusive", "error")


class EnvironmentGateError(ValueError):
    """The two sides cannot be paired (different groups, seeds or episode counts), or a value is not finite."""


@dataclass(frozen=True)
class GroupReturns:
    """One seed group of one side: its episode returns, in candidate-index order."""

    group_index: int
    seed: int
    returns: tuple[float, ...]


@dataclass(frozen=True)
class GateThresholds:
    """`environment_eval.gate`: `min_mean_return` (optional), `min_mean_improvement` (>= 0, default 0)."""

    min_mean_return: float | None = None
    min_mean_improvement: float = 0.0

    @classmethod
    def of(cls, value: Mapping | None) -> GateThresholds | None:
        """The normalized request's gate object (None: no gate)."""
        if value is None:
            return None
        return cls(min_mean_return=value.get("min_mean_return"),
                   min_mean_improvement=value.get("min_mean_improvement", 0.0))


@dataclass(frozen=True)
class EnvironmentGateResult:
    decision: str                 # one of DECISIONS
    reason: str                   # for a person
    evidence: dict                # the receipt's evidence block; evidence["decision"] == decision
    p_value: Fraction             # exact
    baseline_mean: Fraction
    candidate_mean: Fraction
    pairs: list[dict] = field(default_factory=list)  # per group: index, seed, both means (display floats), sign


def exact(value, what: str) -> Fraction:
    """The exact rational of a finite JSON number, as its shortest decimal text spells it."""
    if isinstance(value, bool) or not isinstance(value, int | float | Fraction):
        raise EnvironmentGateError(f"{what} must be a number, not {value!r}")
    if isinstance(value, Fraction | int):
        return Fraction(value)
    if not math.isfinite(value):
        raise EnvironmentGateError(f"{what} must be finite, not {value!r}")
    return Fraction(repr(value))


def sign_test_p_value(improved: int, regressed: int) -> Fraction:
    """The exact two-sided sign-test p-value, min(1, 2 * P(X <= min) for X ~ Binomial(n, 1/2))."""
    for name, value in (("improved", improved), ("regressed", regressed)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer")
    n = improved + regressed
    if n == 0:
        return Fraction(1)
    tail = sum(math.comb(n, i) for i in range(min(improved, regressed) + 1))
    return min(Fraction(1), Fraction(2 * tail, 2**n))


def group_mean(returns: Sequence) -> Fraction:
    values = [exact(r, "an episode return") for r in returns]
    if not values:
        raise EnvironmentGateError("a seed group has no episodes")
    return sum(values, Fraction(0)) / len(values)


def mean_of(values: Iterable[Fraction]) -> Fraction:
    values = list(values)
    return sum(values, Fraction(0)) / len(values) if values else Fraction(0)


def _pairs(baseline: Sequence[GroupReturns], candidate: Sequence[GroupReturns]) -> list[tuple[GroupReturns, GroupReturns]]:
    def index(side, groups):
        out = {}
        for group in groups:
            if group.group_index in out:
                raise EnvironmentGateError(f"the {side} has group {group.group_index} twice")
            out[group.group_index] = group
        return out

    left, right = index("baseline", baseline), index("candidate", candidate)
    if set(left) != set(right):
        only = sorted(set(left) ^ set(right))
        raise EnvironmentGateError(f"the sides cover different seed groups (first unpaired group {only[0]})")
    pairs = []
    for key in sorted(left):
        b, c = left[key], right[key]
        if b.seed != c.seed:
            raise EnvironmentGateError(f"group {key}: baseline seed {b.seed}, candidate seed {c.seed}")
        if len(b.returns) != len(c.returns):
            raise EnvironmentGateError(f"group {key}: {len(b.returns)} baseline episodes, {len(c.returns)} candidate")
        pairs.append((b, c))
    return pairs


def _fraction_text(value: Fraction) -> str:
    return f"{value.numerator}/{value.denominator}"


def paired_return_sign_test_v1(*, baseline: Sequence[GroupReturns], candidate: Sequence[GroupReturns],
                               gate: GateThresholds | None) -> EnvironmentGateResult:
    """Apply the gate (or, with `gate=None`, the diagnostic summary). Raises EnvironmentGateError."""
    floor = exact(gate.min_mean_return, "min_mean_return") if gate and gate.min_mean_return is not None else None
    margin = exact(gate.min_mean_improvement, "min_mean_improvement") if gate else Fraction(0)
    if margin < 0:
        raise EnvironmentGateError("min_mean_improvement must be at least 0")
    pairs = _pairs(baseline, candidate)
    improved = regressed = tied = 0
    rows, base_means, cand_means = [], [], []
    for b, c in pairs:
        bm, cm = group_mean(b.returns), group_mean(c.returns)
        base_means.append(bm)
        cand_means.append(cm)
        sign = "improved" if cm > bm else "regressed" if cm < bm else "tied"
        improved += sign == "improved"
        regressed += sign == "regressed"
        tied += sign == "tied"
        rows.append({"group_index": b.group_index, "seed": b.seed, "baseline_mean_return": float(bm),
                     "candidate_mean_return": float(cm), "sign": sign})
    n = len(pairs)
    p = sign_test_p_value(improved, regressed)
    base_mean, cand_mean = mean_of(base_means), mean_of(cand_means)
    improvement = cand_mean - base_mean
    counts = f"improved {improved}, regressed {regressed}, tied {tied}, exact two-sided p={float(p):.6g}"

    if gate is None:
        decision, reason = "diagnostic", f"no gate configured: the comparison is diagnostic ({counts})"
    elif n < MIN_PAIRED_GROUPS:
        decision, reason = "inconclusive", (f"only {n} paired seed groups; {POLICY_VERSION} needs at least "
                                            f"{MIN_PAIRED_GROUPS}")
    elif regressed > improved and p < ALPHA:
        decision, reason = "rejected", f"the candidate is significantly worse than the baseline ({counts})"
    elif floor is not None and cand_mean < floor:
        decision, reason = "rejected", (f"the candidate's mean return {float(cand_mean):.6g} is below "
                                        f"min_mean_return {float(floor):.6g}")
    elif improvement < margin:
        decision, reason = "rejected", (f"the mean return improvement {float(improvement):.6g} is below "
                                        f"min_mean_improvement {float(margin):.6g}")
    elif improved > regressed and p < ALPHA:
        decision, reason = "passed", f"significant paired improvement in mean return ({counts})"
    else:
        decision, reason = "inconclusive", f"no significant paired improvement over the baseline ({counts})"

    episodes = sum(len(b.returns) for b, _ in pairs)
    evidence = {
        "policy_version": POLICY_VERSION,
        "paired_groups": n,
        "paired_episodes": episodes,
        "minimum_paired_groups": MIN_PAIRED_GROUPS,
        "baseline_mean_return": float(base_mean),
        "candidate_mean_return": float(cand_mean),
        "mean_return_improvement": float(improvement),
        "improved_groups": improved,
        "regressed_groups": regressed,
        "tied_groups": tied,
        "exact_sign_test_p_value": float(p),
        "exact_sign_test_p_value_rational": _fraction_text(p),
        "exact_sign_test_alpha": float(ALPHA),
        "minimum_mean_return": float(floor) if floor is not None else None,
        "minimum_mean_improvement": float(margin) if gate is not None else None,
        "gated": gate is not None,
        "decision": decision,
        "reason": reason,
    }
    return EnvironmentGateResult(decision, reason, evidence, p, base_mean, cand_mean, rows)


def final_outcome(decision: str, auto_load: bool) -> str:
    """The receipt's `outcome` for a gate decision: passed -> promoted (auto_load) or kept; the others
    keep their name (rejected and inconclusive are never served; diagnostic decides nothing)."""
    if decision not in DECISIONS:
        raise ValueError(f"decision must be one of {', '.join(DECISIONS)}, got {decision!r}")
    if decision == "passed":
        return "promoted" if auto_load else "kept"
    return decision


def outcome_consistent(decision: str, outcome: str) -> bool:
    """§2.8: passed -> promoted/kept/error; rejected -> rejected; inconclusive -> inconclusive (or error);
    diagnostic -> diagnostic (or error)."""
    allowed = {"passed": ("promoted", "kept", "error"), "rejected": ("rejected",),
               "inconclusive": ("inconclusive", "error"), "diagnostic": ("diagnostic", "error")}
    return outcome in allowed.get(decision, ())


def group_returns_of(summary: Mapping) -> list[GroupReturns]:
    """Per-group episode returns from a `kiln.openenv-rollout-summary.v5` document's `rollouts` records."""
    rollouts = summary.get("rollouts")
    if not isinstance(rollouts, list):
        raise EnvironmentGateError("the summary has no rollouts list")
    groups: dict[int, dict] = {}
    for record in rollouts:
        try:
            index, seed, candidate = record["group_index"], record["seed"], record["candidate_index"]
            value = record["episode_return"]
        except (KeyError, TypeError):
            raise EnvironmentGateError("a summary rollout record lacks group_index, seed, candidate_index or "
                                       "episode_return") from None
        group = groups.setdefault(index, {"seed": seed, "returns": {}})
        if group["seed"] != seed or candidate in group["returns"]:
            raise EnvironmentGateError(f"group {index} has inconsistent records in the summary")
        group["returns"][candidate] = value
    return [GroupReturns(index, group["seed"], tuple(group["returns"][k] for k in sorted(group["returns"])))
            for index, group in sorted(groups.items())]
