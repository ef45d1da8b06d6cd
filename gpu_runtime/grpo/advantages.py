"""Group advantages (spec §3.1 step 2) and the group filters (step 1) with their receipt counts.

Pure Python (floats in, floats out): imports neither torch nor Django. The trainer turns the
advantages into a tensor; the admission code can run the filters without loading torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

VANILLA_STD_EPS = 1e-8


def population_variance(rewards: Sequence[float]) -> float:
    """Population variance (divide by n), the statistic the reward-variance filter bounds."""
    if is_degenerate_group(rewards):
        return 0.0  # exactly: the float mean of equal values can miss them by an ulp (1e-34, not 0)
    mean = math.fsum(rewards) / len(rewards)
    return math.fsum((r - mean) ** 2 for r in rewards) / len(rewards)


def group_advantages(rewards: Sequence[float], mode: str = "dr_grpo") -> list[float]:
    """A_i for one group, constant across the completion's tokens.

    dr_grpo (default): A_i = r_i - mean(r).  vanilla: A_i = (r_i - mean(r)) / (std(r) + 1e-8),
    with the population std. A group with all-equal rewards (or of one) has no relative signal:
    its advantages are exactly 0.
    """
    if mode not in ("dr_grpo", "vanilla"):
        raise ValueError(f"unknown advantage_mode {mode!r}")
    if any(not math.isfinite(r) for r in rewards):
        raise ValueError("rewards must be finite")
    if is_degenerate_group(rewards):
        # Exactly zero: the float mean of equal values can miss them by an ulp, which vanilla's
        # 1e-8 denominator would blow up into a spurious advantage.
        return [0.0] * len(rewards)
    mean = math.fsum(rewards) / len(rewards)
    centred = [r - mean for r in rewards]
    if mode == "dr_grpo":
        return centred
    std = math.sqrt(population_variance(rewards))
    return [c / (std + VANILLA_STD_EPS) for c in centred]


def is_degenerate_group(rewards: Sequence[float]) -> bool:
    """All rewards equal (or none): every advantage is zero, so there is no policy signal."""
    return len(set(rewards)) <= 1


@dataclass(frozen=True)
class GroupDecision:
    """One group's fate, for the reward-filter sidecar (`reward_filter_groups.json`)."""

    index: int
    reward_variance: float
    kept: bool
    # variance_below_min | variance_above_max | below_min_groups | degenerate
    reject_reason: str | None = None


@dataclass(frozen=True)
class GroupFilterResult:
    """What survives the filters, with the counts the train receipt's `data`/`grpo` blocks need."""

    kept_indices: tuple[int, ...]
    groups_read: int
    reward_filter_enabled: bool
    reward_groups_kept: int  # after the variance filter (and its on-empty policy)
    reward_groups_filtered: int
    dynamic_groups_filtered: int
    empty_filter_action: str  # "use-filter" | "fail" | "train-all" | "skip" | "disabled"
    skip_training: bool = False  # on_empty=skip: publish the untrained adapter plus a receipt
    failure_message: str | None = None  # on_empty=fail: the run fails with this message
    decisions: tuple[GroupDecision, ...] = field(default=(), repr=False)

    @property
    def groups_trained(self) -> int:
        return len(self.kept_indices)


def filter_groups(
    groups_rewards: Sequence[Sequence[float]],
    *,
    dynamic_sampling: bool = True,
    var_min: float | None = None,
    var_max: float | None = None,
    min_groups: int = 1,
    on_empty: str = "fail",
) -> GroupFilterResult:
    """Apply the reward-variance filter (when a bound is set), then dynamic sampling.

    The variance filter keeps groups with var_min <= population variance <= var_max (inclusive).
    If fewer than `min_groups` survive it: `fail` keeps nothing and reports a failure message,
    `train-all` ignores the variance filter for this run, `skip` keeps nothing and asks the
    caller to publish an untrained adapter. Dynamic sampling then drops groups whose rewards
    are all equal; it is a separate filter with its own count (`dynamic_groups_filtered`).
    Pass `GrpoConfig` fields: `filter_groups(r, **filter_kwargs(config))`.
    """
    if on_empty not in ("fail", "train-all", "skip"):
        raise ValueError(f"unknown reward_filter_on_empty {on_empty!r}")
    variances = [population_variance(rewards) for rewards in groups_rewards]
    n = len(groups_rewards)
    enabled = var_min is not None or var_max is not None
    reasons: list[str | None] = [None] * n
    if enabled:
        for i, variance in enumerate(variances):
            if var_min is not None and variance < var_min:
                reasons[i] = "variance_below_min"
            elif var_max is not None and variance > var_max:
                reasons[i] = "variance_above_max"
    candidates = [i for i in range(n) if reasons[i] is None]

    action = "use-filter" if enabled else "disabled"
    failure = None
    skip = False
    if enabled and len(candidates) < min_groups:
        action = on_empty
        if on_empty == "train-all":
            candidates, reasons = list(range(n)), [None] * n
        else:
            if on_empty == "fail":
                failure = (
                    f"reward variance filter kept {len(candidates)} group(s), below "
                    f"reward_filter_min_groups {min_groups} (reward_filter_on_empty=fail)"
                )
            skip = on_empty == "skip"
            reasons = [reason or "below_min_groups" for reason in reasons]
            candidates = []
    reward_kept = len(candidates)

    kept: list[int] = []
    dynamic_filtered = 0
    for i in candidates:
        if dynamic_sampling and is_degenerate_group(groups_rewards[i]):
            dynamic_filtered += 1
            reasons[i] = "degenerate"
        else:
            kept.append(i)
    kept_set = set(kept)
    decisions = tuple(
        GroupDecision(index=i, reward_variance=variances[i], kept=i in kept_set, reject_reason=reasons[i])
        for i in range(n)
    )
    return GroupFilterResult(
        kept_indices=tuple(kept),
        groups_read=n,
        reward_filter_enabled=enabled,
        reward_groups_kept=reward_kept if enabled else n,
        reward_groups_filtered=(n - reward_kept) if enabled else 0,
        dynamic_groups_filtered=dynamic_filtered,
        empty_filter_action=action,
        skip_training=skip,
        failure_message=failure,
        decisions=decisions,
    )


def filter_kwargs(config) -> dict:
    """The `filter_groups` keyword arguments from a GrpoConfig."""
    return {
        "dynamic_sampling": config.dynamic_sampling,
        "var_min": config.reward_filter_var_min,
        "var_max": config.reward_filter_var_max,
        "min_groups": config.reward_filter_min_groups,
        "on_empty": config.reward_filter_on_empty,
    }
