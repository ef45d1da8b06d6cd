"""Template substitution, owned-field refusals and task loading (evaluations.generation.template)."""

from __future__ import annotations

import json

import pytest

from evaluations.generation.errors import RolloutError
from evaluations.generation.generate import plan_requests
from evaluations.generation.template import RenderOptions, Task, load_tasks, load_template, render_request

TASK = Task("sum-1", {"id": "sum-1", "prompt": "What is 47 + 38?", "answer": 85, "meta": {"level": 2},
                      "max_tokens": 16}, 1)
BASE = RenderOptions(adapter="base", thinking=False)
TEMPLATE = {"model": "kiln", "messages": [{"role": "user", "content": "{{prompt}}"}], "temperature": 0.9,
            "max_tokens": 64}


def render(template=None, task=TASK, seed=42, options=BASE):
    return render_request(template or TEMPLATE, task, seed=seed, options=options)


def test_renders_the_guide_template_and_sets_the_owned_fields():
    body = render()
    assert body["messages"] == [{"role": "user", "content": "What is 47 + 38?"}]
    assert body["temperature"] == 0.9 and body["max_tokens"] == 64 and body["model"] == "kiln"
    assert body["seed"] == 42 and body["adapter"] == "base" and body["n"] == 1 and body["stream"] is False
    assert body["rollout_provenance"] is True
    assert body["chat_template_kwargs"] == {"enable_thinking": False}
    assert "thinking_budget_tokens" not in body


def test_named_adapter_thinking_and_budget_are_sent():
    body = render(options=RenderOptions(adapter="math-r001", thinking=True, thinking_budget_tokens=32))
    assert body["adapter"] == "math-r001"
    assert body["chat_template_kwargs"] == {"enable_thinking": True}
    assert body["thinking_budget_tokens"] == 32 and "thinking_budget_ms" not in body
    timed = render(options=RenderOptions(adapter="base", thinking=True, thinking_budget_ms=1500))
    assert timed["thinking_budget_ms"] == 1500 and "thinking_budget_tokens" not in timed


def test_the_time_budget_is_the_commands_and_needs_thinking():
    options = RenderOptions(adapter="base", thinking=True, thinking_budget_ms=1500)
    assert render({**TEMPLATE, "thinking_budget_ms": 1500}, options=options)["thinking_budget_ms"] == 1500
    with pytest.raises(RolloutError) as err:
        render({**TEMPLATE, "thinking_budget_ms": 99}, options=options)
    assert err.value.code == "template_owned_field" and "use --thinking-budget-ms" in err.value.message
    with pytest.raises(RolloutError) as err:
        render(options=RenderOptions(adapter="base", thinking=False, thinking_budget_ms=10))
    assert err.value.code == "thinking_budget_needs_thinking" and "--thinking-budget-ms" in err.value.message


def test_whole_string_placeholders_keep_their_json_type_and_embedded_ones_render_as_text():
    template = {**TEMPLATE, "max_tokens": "{{task.max_tokens}}", "messages": [
        {"role": "system", "content": "level {{task.meta.level}}, thinking {{thinking_enabled}}, {{task.meta}}"},
        {"role": "user", "content": "[{{adapter_label}} #{{ seed }}] {{task.prompt}} ({{task.answer}})"}],
        "metadata_echo": {"answer": "{{task.answer}}", "thinking": "{{thinking_enabled}}", "seed": "{{seed}}"}}
    body = render(template, options=RenderOptions(adapter="math-r001", thinking=True))
    assert body["max_tokens"] == 16 and isinstance(body["max_tokens"], int)
    assert body["metadata_echo"] == {"answer": 85, "thinking": True, "seed": 42}
    assert body["messages"][0]["content"] == 'level 2, thinking true, {"level":2}'
    assert body["messages"][1]["content"] == "[math-r001 #42] What is 47 + 38? (85)"


@pytest.mark.parametrize("placeholder, code", [
    ("{{promt}}", "template_placeholder_unknown"),
    ("{{task.missing}}", "template_field_missing"),
    ("{{task.meta.nope}}", "template_field_missing"),
    ("{{task.}}", "template_placeholder_unknown"),
])
def test_unknown_placeholders_and_missing_fields_name_the_task(placeholder, code):
    template = {**TEMPLATE, "messages": [{"role": "user", "content": f"x {placeholder}"}]}
    with pytest.raises(RolloutError) as err:
        render(template)
    assert err.value.code == code and "task 'sum-1'" in err.value.message


def test_prompt_placeholder_needs_a_prompt_field():
    with pytest.raises(RolloutError, match="has no `prompt` field") as err:
        render(task=Task("t9", {"id": "t9", "question": "q"}, 3))
    assert "task 't9'" in err.value.message


@pytest.mark.parametrize("field, value", [
    ("n", 2), ("n", True), ("stream", True), ("rollout_provenance", False), ("seed", 7), ("seed", "42"),
    ("adapter", "other"), ("chat_template_kwargs", {"enable_thinking": True}),
    ("chat_template_kwargs", {"foo": 1}), ("thinking_budget_tokens", 10),
])
def test_owned_fields_with_another_value_are_refused(field, value):
    with pytest.raises(RolloutError) as err:
        render({**TEMPLATE, field: value})
    assert err.value.code == "template_owned_field" and "task 'sum-1'" in err.value.message


@pytest.mark.parametrize("field, value", [
    ("n", 1), ("stream", False), ("rollout_provenance", True), ("seed", "{{seed}}"), ("adapter", "base"),
    ("adapter", None), ("chat_template_kwargs", {"enable_thinking": False}), ("tools", []),
])
def test_owned_fields_repeating_the_commands_value_are_accepted(field, value):
    assert render({**TEMPLATE, field: value})["seed"] == 42


def test_a_named_adapter_template_must_name_the_same_adapter():
    options = RenderOptions(adapter="math-r001", thinking=False)
    assert render({**TEMPLATE, "adapter": "math-r001"}, options=options)["adapter"] == "math-r001"
    with pytest.raises(RolloutError, match="--adapter is 'math-r001'"):
        render({**TEMPLATE, "adapter": "base"}, options=options)


@pytest.mark.parametrize("extra", [
    {"tools": [{"type": "function", "function": {"name": "f"}}]},
    {"tool_choice": "auto"},
    {"messages": [{"role": "user", "content": "hi", "tool_calls": [{"id": "1"}]}]},
])
def test_tools_are_refused(extra):
    with pytest.raises(RolloutError) as err:
        render({**TEMPLATE, **extra})
    assert err.value.code == "template_tools_refused"


def test_a_budget_needs_thinking():
    with pytest.raises(RolloutError) as err:
        render(options=RenderOptions(adapter="base", thinking=False, thinking_budget_tokens=8))
    assert err.value.code == "thinking_budget_needs_thinking"


def test_messages_are_normalised_to_the_shape_the_server_samples_from():
    template = {**TEMPLATE, "messages": [
        {"role": "system", "content": [{"type": "text", "text": "Be "}, {"type": "text", "text": "brief."}],
         "name": None},
        {"role": "user", "content": "{{prompt}}", "name": "alice"}]}
    assert render(template)["messages"] == [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "What is 47 + 38?", "name": "alice"}]
    with pytest.raises(RolloutError, match="must render to text"):
        render({**TEMPLATE, "messages": [{"role": "user", "content": "{{task.answer}}"}]})
    with pytest.raises(RolloutError, match="unsupported fields: weight"):
        render({**TEMPLATE, "messages": [{"role": "user", "content": "x", "weight": 1}]})


@pytest.mark.parametrize("change, needle", [
    ({"temperature": 3.0}, "temperature"),
    ({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}, "last message"),
    ({"max_tokens": 100000}, "cap"),
    ({"logit_bias": {"1": 2.0}}, "logit_bias"),
])
def test_the_server_contract_is_checked_before_sending(change, needle):
    with pytest.raises(RolloutError, match=needle) as err:
        render({**TEMPLATE, **change})
    assert err.value.code == "request_invalid" and "task 'sum-1'" in err.value.message


def test_a_seed_inside_messages_would_split_the_group_and_is_refused():
    template = {**TEMPLATE, "messages": [{"role": "user", "content": "{{prompt}} #{{seed}}"}]}
    with pytest.raises(RolloutError, match="differ between seeds") as err:
        plan_requests(template, [TASK], [1, 2], BASE)
    assert err.value.seed == 2


def test_plan_renders_every_task_and_seed_in_order():
    tasks = [TASK, Task("sum-2", {"id": "sum-2", "prompt": "What is 1 + 2?"}, 2)]
    planned = plan_requests(TEMPLATE, tasks, [5, 6, 7], BASE)
    assert [(p.task.id, p.seed, p.index) for p in planned] == [
        ("sum-1", 5, 0), ("sum-1", 6, 1), ("sum-1", 7, 2), ("sum-2", 5, 3), ("sum-2", 6, 4), ("sum-2", 7, 5)]
    assert planned[4].parsed.seed == 6


def test_load_tasks(tmp_path):
    path = tmp_path / "tasks.jsonl"
    path.write_text('{"id": "a", "prompt": "p"}\n\n{"id": 7, "prompt": "q"}\n')
    assert [(t.id, t.line) for t in load_tasks(path)] == [("a", 1), ("7", 3)]
    for text, needle in [('{"prompt": "p"}\n', "needs an `id`"), ('{"id": "a"}\n{"id": "a"}\n', "duplicate task id"),
                         ('{"id": "a"}\n{oops\n', ":2: not valid JSON"), ("[1]\n", "must be a JSON object"),
                         ("\n", "holds no tasks")]:
        path.write_text(text)
        with pytest.raises(RolloutError, match=needle):
            load_tasks(path)


def test_load_template(tmp_path):
    path = tmp_path / "request.json"
    path.write_text(json.dumps(TEMPLATE))
    assert load_template(path) == TEMPLATE
    for text, needle in [("[]", "must be a JSON object"), ("{", "not valid JSON"), ('{"model": "x"}', "needs `messages`")]:
        path.write_text(text)
        with pytest.raises(RolloutError, match=needle):
            load_template(path)
    with pytest.raises(RolloutError, match="cannot read"):
        load_template(tmp_path / "nope.json")
