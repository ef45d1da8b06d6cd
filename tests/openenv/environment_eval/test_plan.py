"""The eval plan (openenv.environment_eval.EvalPlan): defaults, the seed interval, the gate's bounds."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from openenv.environment_eval import (
    EnvironmentEvalError,
    EvalPlan,
    EvalPolicy,
    seed_interval_overlaps,
    side_config,
)
from openenv.environment_gate import GateThresholds
from tests.openenv.environment_eval.support import base_config


@pytest.mark.parametrize("train, evaluation, overlaps", [
    ((0, 8), (8, 20), False), ((0, 8), (7, 20), True), ((10, 5), (0, 10), False), ((10, 5), (0, 11), True),
    ((10, 5), (12, 1), True), ((0, 0), (0, 5), False)])
def test_seed_interval_overlaps(train, evaluation, overlaps):
    assert seed_interval_overlaps(train, evaluation) is overlaps
    assert seed_interval_overlaps(evaluation, train) is overlaps


@given(st.integers(0, 100), st.integers(1, 30), st.integers(0, 100), st.integers(1, 30))
def test_overlap_is_a_shared_seed(a, n, b, m):
    shared = bool(set(range(a, a + n)) & set(range(b, b + m)))
    assert seed_interval_overlaps((a, n), (b, m)) is shared


def test_defaults_follow_the_spec():
    plan = EvalPlan.of({}, train_seed_start=100, train_groups=8)
    assert (plan.groups, plan.group_size, plan.seed_start, plan.gate) == (20, 1, 108, None)
    gated = EvalPlan.of({"gate": {"min_mean_improvement": 0.05}}, train_seed_start=0, train_groups=8)
    assert gated.gate == GateThresholds(None, 0.05)
    assert gated.to_json() == {"groups": 20, "group_size": 1, "seed_start": "8", "gate": {"min_mean_improvement": 0.05}}


@pytest.mark.parametrize("value, words", [
    ({"seed_start": 105}, "overlap the training seeds [100, 108)"),
    ({"seed_start": 90, "groups": 11}, "overlap"),
    ({"groups": 19, "gate": {}}, "at least 20"),
    ({"gate": {"min_mean_improvement": -0.1}}, "at least 0"),
    ({"gate": {"unknown": 1}}, "takes only"),
    ({"rounds": 3}, "unknown field"),
    ({"group_size": 0}, "group_size")])
def test_bad_plans_are_refused(value, words):
    with pytest.raises(EnvironmentEvalError) as raised:
        EvalPlan.of(value, train_seed_start=100, train_groups=8)
    assert words in raised.value.message
    assert raised.value.stage == "environment_evaluation"


def test_side_config_keeps_the_base_plan_and_bounds(tmp_path):
    base = base_config("http://127.0.0.1:9", tmp_path, concurrency=3, reset_options={"level": 2})
    plan = EvalPlan.of({"groups": 20, "group_size": 2}, train_seed_start=100, train_groups=4)
    config = side_config(base, plan, EvalPolicy("cand"), tmp_path / "candidate")
    assert (config.groups, config.group_size, config.seed_start, config.concurrency) == (20, 2, 104, 2)
    assert config.adapter == "cand" and config.reset_plan() == base.reset_plan()
    assert (config.max_steps, config.max_action_tokens, config.temperature, config.thinking) == \
        (base.max_steps, base.max_action_tokens, base.temperature, base.thinking)
    assert config.summary_output_path == tmp_path / "candidate" / "summary.json"
    assert side_config(base, plan, EvalPolicy(None), tmp_path / "b").adapter == "base"
    if hasattr(base, "training_contract"):  # a train run's contract is not carried into the eval sides
        sealed = side_config(replace(base, training_contract={"schema": "x"}), plan, EvalPolicy("c"), tmp_path / "c")
        assert sealed.training_contract is None
