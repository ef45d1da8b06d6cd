"""One set of bounds: what the chat route accepts, rollout-generate and the sampler accept too, and
what one refuses every one refuses."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from adapters.serving.schemas import ChatCompletionRequest
from core.contracts import sampling as bounds
from evaluations.generation.errors import RolloutError
from evaluations.generation.template import RenderOptions, Task, render_request
from gpu_runtime.sampling import SamplingParams

MESSAGES = [{"role": "user", "content": "hi"}]


def chat(**fields):
    return ChatCompletionRequest(messages=MESSAGES, **fields)


@pytest.mark.parametrize("controls, accepted", [
    ({"temperature": bounds.TEMPERATURE_MAX}, True),
    ({"temperature": bounds.TEMPERATURE_MAX + 0.5}, False),
    ({"top_p": 0.0}, False),
    ({"min_p": 1.0}, True),
    ({"presence_penalty": -bounds.PENALTY_LIMIT}, True),
    ({"frequency_penalty": bounds.PENALTY_LIMIT + 0.1}, False),
    ({"repetition_penalty": bounds.REPETITION_PENALTY_MAX + 1}, False),
    ({"stop": ["x"] * bounds.MAX_STOP_SEQUENCES}, True),
    ({"stop": ["x"] * (bounds.MAX_STOP_SEQUENCES + 1)}, False),
])
def test_the_chat_schema_and_the_sampler_agree_on_every_control(controls, accepted):
    try:
        chat(**controls)
        chat_ok = True
    except ValidationError:
        chat_ok = False
    params = dict(controls)
    if "stop" in params:
        params["stop"] = tuple(params["stop"])
    try:
        SamplingParams(**params).validate()
        sampler_ok = True
    except ValueError:
        sampler_ok = False
    assert chat_ok == sampler_ok == accepted, (controls, chat_ok, sampler_ok)


def test_seeds_are_u64_everywhere():
    top = 2**64 - 1
    assert bounds.MAX_SEED == top
    assert chat(seed=top).seed == top
    with pytest.raises(ValidationError):
        chat(seed=top + 1)
    assert bounds.seed_problem(top) is None and bounds.seed_problem(top + 1) and bounds.seed_problem(-1)
    task = Task(id="t1", fields={"id": "t1", "prompt": "What is 2 + 2?"}, line=1)
    template = {"messages": [{"role": "user", "content": "{{task.prompt}}"}], "max_tokens": 8}
    assert render_request(template, task, seed=top, options=RenderOptions(adapter="base", thinking=False))["seed"] == top
    with pytest.raises(RolloutError):
        render_request(template, task, seed=top + 1, options=RenderOptions(adapter="base", thinking=False))


def test_max_tokens_cap_is_shared():
    with pytest.raises(ValueError):
        SamplingParams(max_tokens=bounds.MAX_TOKENS_CAP + 1).validate()
    SamplingParams(max_tokens=bounds.MAX_TOKENS_CAP).validate()


def test_the_time_budget_reaches_the_sampler_and_needs_thinking():
    from adapters.serving.runtime_host import _sample_requests

    thinking = {"chat_template_kwargs": {"enable_thinking": True}}
    _, requests = _sample_requests(chat(thinking_budget_ms=250, n=2, **thinking), seed_base=7)
    assert [(r.thinking_budget_ms, r.thinking_budget_tokens, r.seed) for r in requests] == [(250, None, 7),
                                                                                          (250, None, 8)]
    _, [both] = _sample_requests(chat(thinking_budget_ms=250, thinking_budget_tokens=16, **thinking), seed_base=1)
    assert (both.thinking_budget_ms, both.thinking_budget_tokens) == (250, 16)
    for refused in ({"thinking_budget_ms": 0, **thinking},
                    {"thinking_budget_ms": 250, "chat_template_kwargs": {"enable_thinking": False}}):
        with pytest.raises(ValidationError):
            chat(**refused)
