"""Every drift between a request and its response is caught (evaluations.generation.validation)."""

from __future__ import annotations

import copy

import pytest

from core.contracts.provenance import scored_payload_sha256
from evaluations.generation.errors import RolloutError
from evaluations.generation.template import RenderOptions, Task, parse_request, render_request
from evaluations.generation.validation import check_consistency, completion_text, validate_response
from tests.rollouts.fakes import ADAPTER, fake_response

TASK = Task("sum-1", {"id": "sum-1", "prompt": "What is 2 + 3?", "answer": 5}, 1)
TASK2 = Task("sum-2", {"id": "sum-2", "prompt": "What is 4 + 4?", "answer": 8}, 2)
TEMPLATE = {"model": "kiln", "messages": [{"role": "user", "content": "{{prompt}}"}], "temperature": 0.9,
            "max_tokens": 64, "stop": ["\n\n"]}
BASE = RenderOptions(adapter="base", thinking=False)
NAMED = RenderOptions(adapter="math-r001", thinking=False)
THINK = RenderOptions(adapter="base", thinking=True, thinking_budget_tokens=16)


def body_for(options=BASE, seed=42, task=TASK, template=TEMPLATE):
    return render_request(template, task, seed=seed, options=options)


def check(response, options=BASE, seed=42, task=TASK, body=None):
    body = body or body_for(options, seed, task)
    return validate_response(response, task=task, seed=seed, body=body, parsed=parse_request(body, task),
                             options=options)


def test_a_faithful_response_validates():
    rollout = check(fake_response(body_for()))
    assert rollout.text == rollout.content == "5"
    assert rollout.sampled_tokens == 1 and rollout.forced_tokens == 0
    assert rollout.adapter is None and rollout.record["seed"] == 42


def test_thinking_text_is_rebuilt_byte_exactly_from_reasoning_and_content():
    body = body_for(THINK)
    rollout = check(fake_response(body, reasoning="2 + 3 = 5\n", content="\n\n5", forced=1), THINK, body=body)
    assert rollout.text == "2 + 3 = 5\n</think>\n\n5" and rollout.content == "\n\n5"
    assert rollout.forced_tokens == 1
    # Reasoning that never closed: the server returns it all as reasoning and empty content.
    unclosed = {"role": "assistant", "content": "", "reasoning_content": "2 + 3 = "}
    assert completion_text(unclosed, {"scored_payload_sha256": scored_payload_sha256("2 + 3 = ")}) == "2 + 3 = "
    assert completion_text({"content": "a"}, {"scored_payload_sha256": "sha256:" + "0" * 64}) is None


def test_a_named_adapter_validates():
    body = body_for(NAMED)
    assert check(fake_response(body), NAMED, body=body).adapter == ADAPTER


def _tamper(path, value):
    def apply(response):
        target = response
        for key in path[:-1]:
            target = target[key]
        if value is _DELETE:
            del target[path[-1]]
        else:
            target[path[-1]] = value(target[path[-1]]) if callable(value) else value
        return response
    return apply


_DELETE = object()
CHOICE = ("choices", 0)
RECORD = (*CHOICE, "rollout_provenance")


@pytest.mark.parametrize("name, tamper, check_name", [
    ("echoed seed", _tamper((*CHOICE, "seed"), "43"), "seed"),
    ("record seed", _tamper((*RECORD, "seed"), 43), "seed"),
    ("adapter on a base request", _tamper((*CHOICE, "adapter"), dict(ADAPTER)), "adapter"),
    ("prompt digest", _tamper((*RECORD, "prompt_messages_sha256"), "sha256:" + "9" * 64), "prompt_digest"),
    ("content edited", _tamper((*CHOICE, "message", "content"), "6"), "content_digest"),
    ("payload digest", _tamper((*RECORD, "scored_payload_sha256"), "sha256:" + "9" * 64), "content_digest"),
    ("usage completion", _tamper(("usage", "completion_tokens"), lambda v: v + 1), "usage"),
    ("usage prompt", _tamper(("usage", "prompt_tokens"), lambda v: v - 1), "usage"),
    ("usage total", _tamper(("usage", "total_tokens"), lambda v: v + 5), "usage"),
    ("temperature", _tamper((*RECORD, "sampling", "temperature"), 0.5), "sampling"),
    ("top_k", _tamper((*RECORD, "sampling", "top_k"), 5), "sampling"),
    ("max_tokens", _tamper((*RECORD, "sampling", "max_tokens"), 65), "sampling"),
    ("stop", _tamper((*RECORD, "sampling", "stop"), []), "sampling"),
    ("budget appeared", _tamper((*RECORD, "sampling", "thinking_budget"), {"max_tokens": 4, "close_token_ids": [7]}),
     "sampling"),
    ("enable_thinking", _tamper((*RECORD, "template_invocation", "template_kwargs"), {"enable_thinking": True}),
     "template_identity"),
    ("tools in invocation", _tamper((*RECORD, "template_invocation", "tools"), [{"type": "function"}]),
     "template_identity"),
    ("unknown record field", _tamper((*RECORD, "extra"), 1), "provenance_schema"),
    ("no provenance", _tamper((*CHOICE, "rollout_provenance"), _DELETE), "response_shape"),
    ("two choices", _tamper(("choices",), lambda v: v + v), "response_shape"),
    ("no usage", _tamper(("usage",), _DELETE), "response_shape"),
])
def test_each_drift_is_caught_and_named(name, tamper, check_name):
    body = body_for()
    response = tamper(fake_response(body))
    with pytest.raises(RolloutError) as err:
        check(response, body=body)
    assert err.value.check == check_name, name
    assert err.value.task_id == "sum-1" and err.value.seed == 42
    assert "task 'sum-1', seed 42, check " + check_name in err.value.message


def test_action_tokens_must_cover_exactly_the_completion():
    body = body_for()
    response = fake_response(body, content="15")
    record = response["choices"][0]["rollout_provenance"]
    record["input_token_ids"].append(99)  # a completion token without an action
    response["usage"]["completion_tokens"] += 0
    with pytest.raises(RolloutError) as err:
        check(response, body=body)
    assert err.value.check == "action_coverage"


def test_forced_tokens_need_a_requested_budget():
    budget_body = body_for(THINK)
    response = fake_response(budget_body, forced=1)
    plain_options = RenderOptions(adapter="base", thinking=True)
    plain_body = body_for(plain_options)
    response["choices"][0]["rollout_provenance"]["prompt_messages_sha256"] = \
        fake_response(plain_body)["choices"][0]["rollout_provenance"]["prompt_messages_sha256"]
    with pytest.raises(RolloutError) as err:
        check(response, plain_options, body=plain_body)
    assert err.value.check == "action_coverage"


def test_the_budget_in_the_record_must_be_the_requested_one():
    body = body_for(THINK)
    response = fake_response(body)
    response["choices"][0]["rollout_provenance"]["sampling"]["thinking_budget"]["max_tokens"] = 99
    with pytest.raises(RolloutError) as err:
        check(response, THINK, body=body)
    assert err.value.check == "sampling"


def test_a_time_budget_must_be_recorded_as_requested():
    timed = RenderOptions(adapter="base", thinking=True, thinking_budget_ms=500)
    body = body_for(timed)
    response = fake_response(body, forced=1)  # forced close tokens are allowed under a time budget
    assert check(response, timed, body=body).forced_tokens == 1
    response["choices"][0]["rollout_provenance"]["sampling"]["thinking_budget"]["max_tokens"] = 500
    with pytest.raises(RolloutError) as err:  # a token budget the request did not ask for
        check(response, timed, body=body)
    assert err.value.check == "sampling" and "max_time_ms" in err.value.message


@pytest.mark.parametrize("choice_adapter, record_adapter", [
    (None, None),  # sampled from the base model
    ({"name": "other", "content_sha256": ADAPTER["content_sha256"]}, None),  # another adapter
    (dict(ADAPTER), {"name": "math-r001", "content_sha256": "sha256:" + "7" * 64}),  # record differs
])
def test_named_adapter_drift_is_caught(choice_adapter, record_adapter):
    body = body_for(NAMED)
    response = fake_response(body)
    response["choices"][0]["adapter"] = choice_adapter
    policy = response["choices"][0]["rollout_provenance"]["behavior_policy"]
    if record_adapter is None:
        policy.pop("adapter", None)
        if choice_adapter is not None:
            policy["adapter"] = dict(choice_adapter)
    else:
        policy["adapter"] = record_adapter
    with pytest.raises(RolloutError) as err:
        check(response, NAMED, body=body)
    assert err.value.check == "adapter"


def _rollouts(*mutations):
    """Four validated rollouts (two tasks x two seeds); mutations[i] edits the i-th record first."""
    out = []
    for i, (task, seed) in enumerate([(TASK, 1), (TASK, 2), (TASK2, 1), (TASK2, 2)]):
        body = body_for(BASE, seed, task)
        response = fake_response(body)
        if i < len(mutations) and mutations[i]:
            mutations[i](response["choices"][0]["rollout_provenance"])
        out.append(check(response, BASE, seed, task, body))
    return out


TASKS = {TASK.id: TASK, TASK2.id: TASK2}


def test_consistency_returns_the_shared_identity():
    identity = check_consistency(_rollouts(), TASKS)
    assert identity["generation_backend"] == "torch-cpu"
    assert identity["template_invocation"] == {"template_kwargs": {"enable_thinking": False}}


def _set(*path_and_value):
    *path, value = path_and_value

    def apply(record):
        target = record
        for key in path[:-1]:
            target = target[key]
        target[path[-1]] = value
    return apply


@pytest.mark.parametrize("mutation, check_name", [
    (_set("tokenizer", "vocab_sha256", "sha256:" + "e" * 64), "tokenizer_identity"),
    (_set("tokenizer", "chat_template_sha256", "sha256:" + "e" * 64), "tokenizer_identity"),
    (_set("behavior_policy", "base_model_sha256", "sha256:" + "e" * 64), "behavior_identity"),
    (_set("behavior_policy", "inference_config_sha256", "sha256:" + "e" * 64), "behavior_identity"),
    (_set("generation_backend", "cuda"), "backend"),
])
def test_identity_must_not_change_during_the_run(mutation, check_name):
    with pytest.raises(RolloutError) as err:
        check_consistency(_rollouts(None, None, mutation), TASKS)
    assert err.value.check == check_name and err.value.task_id == "sum-2" and err.value.seed == 1


def test_the_adapter_content_must_not_change_during_the_run():
    rollouts = []
    for i, seed in enumerate((1, 2)):
        body = body_for(NAMED, seed)
        digest = ADAPTER["content_sha256"] if i == 0 else "sha256:" + "8" * 64
        response = fake_response(body, adapter={"name": "math-r001", "content_sha256": digest})
        rollouts.append(check(response, NAMED, seed, body=body))
    with pytest.raises(RolloutError, match="republished") as err:
        check_consistency(rollouts, TASKS)
    assert err.value.check == "adapter"


def test_a_server_default_max_tokens_must_be_one_value_for_the_run():
    template = {k: v for k, v in TEMPLATE.items() if k != "max_tokens"}
    rollouts = []
    for seed, max_tokens in ((1, 256), (2, 128)):
        body = body_for(BASE, seed, template=template)
        response = fake_response(body)
        response["choices"][0]["rollout_provenance"]["sampling"]["max_tokens"] = max_tokens
        rollouts.append(check(response, BASE, seed, body=body))  # unspecified: not checked per response
    with pytest.raises(RolloutError, match="default max_tokens") as err:
        check_consistency(rollouts, TASKS)
    assert err.value.check == "sampling"


def test_rollouts_are_not_mutated_by_validation():
    body = body_for()
    response = fake_response(body)
    before = copy.deepcopy(response)
    check(response, body=body)
    assert response == before
