"""Group advantages (hand-computed) and the dynamic-sampling / reward-variance filters."""

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from core.contracts.grpo_config import GrpoConfig
from gpu_runtime.grpo.advantages import (
    filter_groups,
    filter_kwargs,
    group_advantages,
    is_degenerate_group,
    population_variance,
)


def test_dr_grpo_is_mean_centred_without_std():
    assert group_advantages([1.0, 0.0, 0.0, 1.0]) == [0.5, -0.5, -0.5, 0.5]
    assert group_advantages([3.0, 0.0, 0.0], "dr_grpo") == [2.0, -1.0, -1.0]


def test_vanilla_divides_by_population_std_plus_eps():
    # rewards 1,0,0,1: mean 0.5, population std 0.5 -> A = +-0.5 / (0.5 + 1e-8)
    expected = 0.5 / (0.5 + 1e-8)
    assert group_advantages([1.0, 0.0, 0.0, 1.0], "vanilla") == pytest.approx(
        [expected, -expected, -expected, expected], abs=1e-15
    )
    # rewards 3,0,0: mean 1, population var (4+1+1)/3 = 2, std sqrt(2)
    std = math.sqrt(2.0)
    assert group_advantages([3.0, 0.0, 0.0], "vanilla") == pytest.approx(
        [2 / (std + 1e-8), -1 / (std + 1e-8), -1 / (std + 1e-8)], abs=1e-15
    )


def test_degenerate_and_single_groups_have_zero_advantage():
    assert group_advantages([0.7, 0.7, 0.7], "vanilla") == [0.0, 0.0, 0.0]
    assert group_advantages([5.0]) == [0.0]
    assert group_advantages([]) == []
    with pytest.raises(ValueError):
        group_advantages([1.0, math.nan])
    with pytest.raises(ValueError):
        group_advantages([1.0], "rloo")


rewards_lists = st.lists(st.floats(min_value=-100, max_value=100, allow_nan=False), min_size=1, max_size=16)


@settings(max_examples=200, deadline=None)
@given(rewards_lists)
def test_dr_grpo_advantages_sum_to_zero(rewards):
    assert math.fsum(group_advantages(rewards)) == pytest.approx(0.0, abs=1e-9)


@settings(max_examples=200, deadline=None)
@given(rewards_lists)
def test_vanilla_advantages_sum_to_zero_and_have_unit_std(rewards):
    advantages = group_advantages(rewards, "vanilla")
    assert math.fsum(advantages) == pytest.approx(0.0, abs=1e-6)
    std = math.sqrt(population_variance(rewards))
    if std > 1e-3:
        # (r - mean) / (std + 1e-8): unit std up to the epsilon's share of a small std.
        assert math.sqrt(population_variance(advantages)) == pytest.approx(std / (std + 1e-8), rel=1e-6)


def test_population_variance():
    assert population_variance([1.0, 0.0, 0.0, 1.0]) == 0.25
    assert population_variance([]) == 0.0
    # equal rewards have variance exactly 0 (the float mean of three 0.1s misses 0.1 by an ulp)
    assert population_variance([0.1] * 3) == 0.0 and population_variance([0.7] * 3) == 0.0
    assert is_degenerate_group([1.0, 1.0]) and is_degenerate_group([]) and not is_degenerate_group([1.0, 0.0])


GROUPS = [[1.0, 0.0], [1.0, 1.0], [0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [5.0, -5.0]]
# population variances: 0.25, 0, 0, 0.1875, 25


def test_dynamic_sampling_skips_zero_variance_groups():
    result = filter_groups(GROUPS)
    assert result.kept_indices == (0, 3, 4)
    assert result.dynamic_groups_filtered == 2
    assert (result.reward_groups_kept, result.reward_groups_filtered) == (5, 0)
    assert result.empty_filter_action == "disabled" and not result.reward_filter_enabled
    assert [d.reject_reason for d in result.decisions] == [None, "degenerate", "degenerate", None, None]
    off = filter_groups(GROUPS, dynamic_sampling=False)
    assert off.kept_indices == (0, 1, 2, 3, 4) and off.dynamic_groups_filtered == 0


def test_reward_variance_bounds_are_inclusive():
    result = filter_groups(GROUPS, var_min=0.1875, var_max=0.25)
    assert result.kept_indices == (0, 3)
    assert (result.reward_groups_kept, result.reward_groups_filtered) == (2, 3)
    assert result.dynamic_groups_filtered == 0  # the zero-variance groups were already gone
    reasons = [d.reject_reason for d in result.decisions]
    assert reasons == [None, "variance_below_min", "variance_below_min", None, "variance_above_max"]
    assert [d.reward_variance for d in result.decisions] == [0.25, 0.0, 0.0, 0.1875, 25.0]


def test_reward_filter_on_empty_policies():
    fail = filter_groups(GROUPS, var_min=100.0)
    assert fail.kept_indices == () and fail.failure_message and not fail.skip_training
    assert fail.empty_filter_action == "fail" and fail.reward_groups_filtered == 5
    assert {d.reject_reason for d in fail.decisions} == {"variance_below_min"}

    skip = filter_groups(GROUPS, var_min=100.0, on_empty="skip")
    assert skip.kept_indices == () and skip.skip_training and skip.failure_message is None

    train_all = filter_groups(GROUPS, var_min=100.0, on_empty="train-all")
    assert train_all.empty_filter_action == "train-all"
    assert train_all.reward_groups_kept == 5 and train_all.reward_groups_filtered == 0
    assert train_all.kept_indices == (0, 3, 4)  # dynamic sampling still applies

    few = filter_groups(GROUPS, var_min=1.0, min_groups=2)  # only group 4 passes, 1 < 2
    assert few.empty_filter_action == "fail" and few.kept_indices == ()
    assert [d.reject_reason for d in few.decisions][4] == "below_min_groups"


def test_filter_kwargs_from_config():
    config = GrpoConfig.from_dict(
        {"reward_filter_var_min": 0.2, "reward_filter_on_empty": "skip", "dynamic_sampling": False}
    )
    result = filter_groups(GROUPS, **filter_kwargs(config))
    assert result.kept_indices == (0, 4) and result.dynamic_groups_filtered == 0

