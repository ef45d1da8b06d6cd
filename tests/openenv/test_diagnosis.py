"""The collection's warnings (openenv.collector.diagnosis): most episodes ended at an action Kiln refused, or
the environment refused every action most episodes sent."""

from __future__ import annotations

from openenv.collector.diagnosis import (
    collection_warnings,
    environment_refusal_warning,
    invalid_action_warning,
)
from openenv.collector.prompts import harness_error_segment, observation_segment, protocol_error_segment


def completion(termination: str, code: str | None = None, message: str = "", reward: float = -1.0) -> dict:
    trajectory = [{"role": "assistant", "content": '{"x": 1}', "kind": "action"}]
    if code is not None:
        trajectory.append(harness_error_segment(code, message))
    else:
        trajectory.append(observation_segment("ok"))
    return {"text": "", "reward": reward, "trajectory": trajectory, "openenv": {"termination": termination}}


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
        completion("done", reward=0.5)))
    assert warning.startswith("3 of 4 episodes ended at an action Kiln refused "
                              "(ACTION_SCHEMA_VALIDATION_FAILED 2, INVALID_MODEL_ACTION 1; e.g. the action does "
                              "not match the action schema (enum at /color; 1 problem(s))): the replies are JSON "
                              "but break the action schema")
    assert "protocol-error reward" in warning and "kiln openenv inspect URL" in warning
    # QA: "so most groups have anything to learn from" read as the opposite; the count says what is lost
    assert "so 1 of 2 groups (those whose returns are all the same) have nothing to learn from and the rest less" \
        in warning


def test_groups_whose_returns_differ_before_the_refusals_are_not_counted_as_teaching_nothing():
    """QA: in a multi-step game every episode ended at a refused action, yet valid steps before it had earned
    differing returns and training used every group; the warning said 3 of 8 groups had nothing to learn from."""
    differing = invalid_action_warning(groups_of(
        completion("invalid_model_action", *SCHEMA, reward=-1.0), completion("invalid_model_action", *SCHEMA, reward=-0.98),
        completion("invalid_model_action", *SCHEMA, reward=0.48), completion("invalid_model_action", *SCHEMA, reward=-1.0)))
    assert "so the groups learn less, though every group's returns still differ;" in differing
    assert "nothing to learn" not in differing
    one_flat = invalid_action_warning(groups_of(
        completion("invalid_model_action", *SCHEMA, reward=-1.0), completion("invalid_model_action", *SCHEMA, reward=-1.0),
        completion("invalid_model_action", *SCHEMA, reward=0.48), completion("done", reward=1.0)))
    assert "so 1 of 2 groups (those whose returns are all the same) have nothing to learn from" in one_flat


def test_exactly_half_warns_and_each_code_has_its_advice():
    warning = invalid_action_warning(groups_of(
        completion("invalid_model_action", "MODEL_ACTION_NO_OUTPUT", "the model produced no final answer"),
        completion("done")))
    assert warning.startswith("1 of 2 episodes") and "--max-action-tokens" in warning
    assert "set --thinking-budget-tokens below it" in warning  # QA: "raise" the budget cannot help
    assert "no action to score and are left out of training" in warning  # the guide: discarded, not scored
    unknown = invalid_action_warning(groups_of(completion("invalid_model_action")))
    assert "(UNKNOWN 1; e.g. UNKNOWN)" in unknown and "were refused" in unknown


def test_all_refused_says_no_group_and_a_schema_miss_suggests_thinking_the_other_way():
    """QA: a list[int] action the demo model cannot write got "most groups" (now: no group). On four unseen
    flat schemas two were 4-5x as valid with thinking off and two 1.3-1.6x with it on, so a schema miss
    suggests --thinking the other way too, beside the nested-values caveat."""
    warning = invalid_action_warning(groups_of(*[completion("invalid_model_action", *SCHEMA)] * 4))
    assert "so no group has anything to learn from" in warning
    assert "or try --thinking the other way" in warning and "a list, an object or a nested model" in warning
    unparsed = invalid_action_warning(groups_of(completion("invalid_model_action", "INVALID_MODEL_ACTION", "no")))
    assert "--thinking the other way" in unparsed


def refused_by_the_environment(steps: int, refused: int) -> dict:
    """An episode of `steps` actions, the first `refused` of them answered with a recoverable error."""
    trajectory = []
    for step in range(steps):
        trajectory.append({"role": "assistant", "content": '{"n": 0}', "kind": "action"})
        if step < refused:
            trajectory.append(protocol_error_segment(
                {"code": "VALIDATION_ERROR", "message": "missing word; extra_forbidden n"}, recoverable=True,
                done=step == steps - 1))
        else:
            trajectory.append(observation_segment("ok"))
    return {"text": "", "reward": -3.0, "trajectory": trajectory, "openenv": {"termination": "protocol_error"}}


def test_an_environment_that_refuses_every_valid_action_is_named_not_the_model():
    """QA: a server whose /schema says {"n": int} but whose step wants {"word": str} completed with no
    diagnosis (return -3 everywhere, every group skipped)."""
    groups = groups_of(*[refused_by_the_environment(3, 3)] * 3, refused_by_the_environment(3, 1))
    warning = environment_refusal_warning(groups)
    assert warning.startswith("in 3 of 4 episodes the environment refused every action (VALIDATION_ERROR 9; "
                              "e.g. missing word; extra_forbidden n)")
    assert "its /schema says" in warning and "kiln openenv inspect URL" in warning
    assert collection_warnings(groups) == [warning]  # Kiln refused none of these actions itself
    assert environment_refusal_warning(groups_of(refused_by_the_environment(3, 1),
                                                 refused_by_the_environment(2, 0))) is None
    assert environment_refusal_warning(groups_of(completion("done"), completion("done"))) is None
