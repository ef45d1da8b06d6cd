"""config + post_eval + dry_run from a GRPO request body."""

import pytest

from core.contracts.grpo_config import GrpoConfigError
from core.contracts.grpo_submission import GrpoSubmission, PostEvalConfig


def test_request_with_post_eval_and_dry_run():
    body = {
        "dataset_path": "/data/r001.jsonl",
        "config": {"behavior_policy": "recorded", "output_name": "math-r001", "auto_load": False},
        "post_eval": {"suite": "math-holdout", "min_accuracy": 0.6},
        "dry_run": True,
    }
    submission = GrpoSubmission.from_request(body)
    assert submission.config.behavior_policy == "recorded" and submission.dry_run
    assert submission.post_eval.to_dict() == {
        "suite": "math-holdout",
        "data_scope": "held-out",
        "generation": None,
        "min_accuracy": 0.6,
        "include_baseline": False,
    }
    assert submission.to_dict()["config"]["output_name"] == "math-r001"


def test_defaults():
    submission = GrpoSubmission.from_request({})
    assert submission.post_eval is None and submission.dry_run is False
    assert submission.config.to_dict() == GrpoSubmission.from_request({"config": None}).config.to_dict()


@pytest.mark.parametrize(
    ("post_eval", "field"),
    [
        ({}, "post_eval.suite"),
        ({"suite": "s", "data_scope": "holdout"}, "post_eval.data_scope"),
        ({"suite": "s", "min_accuracy": 1.5}, "post_eval.min_accuracy"),
        ({"suite": "s", "min_accuracy": 0.5, "data_scope": "train-set-eval"}, "post_eval.min_accuracy"),
        ({"suite": "s", "include_baseline": "yes"}, "post_eval.include_baseline"),
        ({"suite": "s", "generation": []}, "post_eval.generation"),
        ("s", "post_eval"),
    ],
)
def test_invalid_post_eval(post_eval, field):
    with pytest.raises(GrpoConfigError) as caught:
        GrpoSubmission.from_request({"post_eval": post_eval})
    assert caught.value.field == field


def test_an_unknown_post_eval_key_is_refused_with_the_close_match():
    """A misspelt min_accuracy ignored would train and promote with no floor: post_eval is strict."""
    with pytest.raises(GrpoConfigError) as caught:
        GrpoSubmission.from_request({"post_eval": {"suite": "math-holdout", "min_acuracy": 0.99}})
    assert caught.value.field == "post_eval.min_acuracy"
    assert caught.value.code == "training_invalid_request"
    assert "unknown field 'min_acuracy' (did you mean 'min_accuracy'?)" in caught.value.message
    assert "suite, data_scope, generation, min_accuracy, include_baseline" in caught.value.message


def test_unknown_config_keys_stay_accepted_and_ignored():
    """Spec §3: only post_eval is strict; GrpoConfig still ignores keys it does not know."""
    submission = GrpoSubmission.from_request({"config": {"not_a_grpo_key": 1}, "post_eval": {"suite": "s"}})
    assert submission.post_eval.suite == "s"


def test_train_set_eval_without_gate_is_allowed():
    assert PostEvalConfig.from_dict({"suite": "s", "data_scope": "train-set-eval"}).min_accuracy is None


def test_invalid_config_and_dry_run():
    with pytest.raises(GrpoConfigError) as caught:
        GrpoSubmission.from_request({"config": {"kl_coeff": -1}})
    assert caught.value.field == "kl_coeff"
    with pytest.raises(GrpoConfigError) as caught:
        GrpoSubmission.from_request({"dry_run": "true"})
    assert caught.value.field == "dry_run"
