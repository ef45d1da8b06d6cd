"""The collection's warning when most episodes ended at an action Kiln refused (openenv.collector.diagnosis)."""

from __future__ import annotations

from openenv.collector.diagnosis import invalid_action_warning
from openenv.collector.prompts import harness_error_segment, observation_segment


def completion(termination: str, code: str | None = None, message: str = "") -> dict:
    trajectory = [{"role": "assistant", "content": '{"x": 1}', "kind": "action"}]
    if code is not None:
        trajectory.append(harness_error_segment(code, message))
    else:
        trajectory.append(observation_segment("ok"))
    return {"text": "", "reward": -1.0, "trajectory": trajectory, "openenv": {"termination": termination}}


def groups_of(*completions) -> list[dict]:
    return [{"completions": list(completions[i:i + 2])} for i in range(0, len(completions), 2)]


SCHEMA = ("ACTION_SCHEMA_VALIDATION_FAILED", "the action does not match the action schema (enum at /color; 1 problem(s))")


def test_no_warning_while_most_episodes_act_validly():
    assert invalid_action_warning([]) is None
    assert invalid_action_warning(groups_of(completion("done"), completion("max_steps"), completion("done"),
                                            completion("invalid_model_action", *SCHEMA))) is None


def test_the_warning_counts_the_codes_quotes_the_commonest_and_says_what_to_try():
    warning = invalid_action_warning(groups_of(
        completion("invalid_model_action", "INVALID_MODEL_ACTION", "the model's answer is not one JSON value"),
        completion("invalid_model_action", *SCHEMA), completion("invalid_model_action", *SCHEMA),
        completion("done")))
    assert warning.startswith("3 of 4 episodes ended at an action Kiln refused "
                              "(ACTION_SCHEMA_VALIDATION_FAILED 2, INVALID_MODEL_ACTION 1; e.g. the action does "
                              "not match the action schema (enum at /color; 1 problem(s))): the replies are JSON "
                              "but break the action schema")
    assert "protocol-error reward" in warning and "kiln openenv inspect URL" in warning


def test_exactly_half_warns_and_each_code_has_its_advice():
    warning = invalid_action_warning(groups_of(
        completion("invalid_model_action", "MODEL_ACTION_NO_OUTPUT", "the model produced no final answer"),
        completion("done")))
    assert warning.startswith("1 of 2 episodes") and "--max-action-tokens" in warning
    unknown = invalid_action_warning(groups_of(completion("invalid_model_action")))
    assert "(UNKNOWN 1; e.g. UNKNOWN)" in unknown and "were refused" in unknown
