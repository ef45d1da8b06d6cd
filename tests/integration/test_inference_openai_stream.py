"""Streaming and /v1/models with the official `openai` client against a running Kiln (tiny model, GPU
worker, Redis, daphne): the README's streaming loop runs, the streamed text is the whole response's
text with stop strings, a refusal arrives as an HTTP error before any chunk, and `model` may name an
adapter that /v1/models lists."""

from __future__ import annotations

import sys

import openai
import pytest

from tests.support.openai_stack import openai_stack

pytestmark = pytest.mark.integration

QUESTION = [{"role": "user", "content": "What is 47 + 13?"}]


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir):
    with openai_stack(tmp_path_factory.mktemp("streaming") / "home", tiny_model_dir, user="stream-user",
                      threads=4) as served:
        yield served


def test_the_readme_streaming_loop_runs(served, capsys):
    """The openai README's loop reads choices[0] of every chunk: no chunk may come without a choice
    unless the request asked for the usage chunk (stream_options.include_usage)."""
    _, client = served
    body = dict(model="kiln", messages=QUESTION, max_tokens=16, seed=1,
                extra_body={"adapter": "base", "chat_template_kwargs": {"enable_thinking": False}})
    stream = client.chat.completions.create(**body, stream=True)
    for chunk in stream:
        print(chunk.choices[0].delta.content or "")
    whole = client.chat.completions.create(**body)
    assert capsys.readouterr().out.replace("\n", "") == whole.choices[0].message.content.replace("\n", "")

    asked = list(client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    assert asked[-1].choices == [] and asked[-1].usage == whole.usage
    assert all(chunk.choices and chunk.usage is None for chunk in asked[:-1])


@pytest.mark.parametrize("stop", ["60", ["0"], " + ", "\n\n", "Observation:"])
def test_streamed_text_is_the_whole_text_with_stop_strings(served, stop):
    _, client = served
    body = dict(model="kiln", messages=QUESTION, max_tokens=40, seed=1, stop=stop, extra_body={"adapter": "base"})
    whole = client.chat.completions.create(**body).choices[0].message
    reasoning = content = ""
    for chunk in client.chat.completions.create(**body, stream=True):
        for choice in chunk.choices:
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            content += choice.delta.content or ""
    assert (reasoning, content) == (whole.model_extra.get("reasoning_content") or "", whole.content)


def test_a_stream_is_refused_with_the_same_http_error_as_a_whole_response(served):
    _, client = served
    long_prompt = [{"role": "user", "content": "7 + " * 5000}]
    for stream in (False, True):
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="kiln", messages=long_prompt, max_tokens=4, stream=stream)
        assert info.value.body["code"] == "context_length_exceeded" and info.value.body["hint"]
        with pytest.raises(openai.UnprocessableEntityError) as info:
            client.chat.completions.create(model="kiln", messages=QUESTION, stop=["x" * 20000], stream=stream)
        assert "16384 bytes" in info.value.body["message"]


def test_model_may_name_an_adapter_that_models_lists(served, tiny_model_dir):
    stack, client = served
    stack.run([sys.executable, "-m", "tests.support.make_adapter", "ad2", str(tiny_model_dir), "3"])
    base_id = stack.env["KILN_MODEL_PATH"].rsplit("/", 1)[1]
    listed = {m.id: m.model_extra.get("parent") for m in client.models.list().data}
    assert listed == {base_id: None, "ad2": base_id}
    assert client.models.retrieve("ad2").owned_by == "kiln"
    by_model = client.chat.completions.create(model="ad2", messages=QUESTION, max_tokens=8, temperature=0.0)
    assert by_model.choices[0].model_extra["adapter"]["name"] == "ad2"
    assert by_model.model == "ad2"  # answered by the name asked for, as vLLM answers a LoRA
    streamed = list(client.chat.completions.create(model="ad2", messages=QUESTION, max_tokens=4, stream=True))
    assert {chunk.model for chunk in streamed} == {"ad2"}
    explicit = client.chat.completions.create(model="ad2", messages=QUESTION, max_tokens=8, temperature=0.0,
                                              extra_body={"adapter": "base"})
    assert explicit.choices[0].model_extra["adapter"] is None and explicit.model == base_id
    guide = client.chat.completions.create(model="Qwen3.5-4B", messages=QUESTION, max_tokens=8, temperature=0.0)
    assert guide.choices[0].model_extra["adapter"] is None  # no active adapter: the base model serves
    assert guide.model == base_id  # a name the server does not serve is answered with what served
