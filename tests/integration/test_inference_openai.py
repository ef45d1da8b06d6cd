"""The official `openai` client against a running Kiln with the tiny model (GPU worker, Redis, daphne)."""

from __future__ import annotations

import sys
import threading

import openai
import pytest
import torch

from tests.support.openai_stack import openai_stack

pytestmark = pytest.mark.integration

ARITHMETIC = [{"role": "user", "content": "What is 12 + 7? Reply with just the number."}]


@pytest.fixture(scope="module")
def served(tmp_path_factory, tiny_model_dir):
    with openai_stack(tmp_path_factory.mktemp("inference") / "home", tiny_model_dir, user="inference-user",
                      threads=8) as served:
        yield served


def _ask(client, seed: int, **extra):
    body = dict(model="kiln-tiny", messages=ARITHMETIC, temperature=0.9, max_tokens=12, seed=seed)
    body.update(extra)
    kiln_fields = {k: body.pop(k) for k in ("adapter", "chat_template_kwargs", "rollout_provenance") if k in body}
    return client.chat.completions.create(**body, extra_body=kiln_fields)


def test_non_streaming_completion_with_usage_and_models(served):
    stack, client = served
    response = _ask(client, seed=5, chat_template_kwargs={"enable_thinking": False})
    choice = response.choices[0]
    served_id = stack.env["KILN_MODEL_PATH"].rsplit("/", 1)[1]
    # `model` names the model actually served, not the one the request asked for ("kiln-tiny").
    assert response.object == "chat.completion" and response.model == served_id
    assert isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert response.usage.total_tokens == response.usage.prompt_tokens + response.usage.completion_tokens
    assert response.usage.completion_tokens >= 1
    models = client.models.list()
    assert [m.id for m in models.data] == [served_id]
    assert client.models.retrieve(served_id).id == served_id
    with pytest.raises(openai.NotFoundError) as missing:
        client.models.retrieve("no-such-model")
    assert missing.value.body["code"] == "model_not_found"
    # GET /metrics: the GPU worker writes its inference counts within a few seconds
    import time

    import httpx

    from tests.support.metrics import sample

    def counted(name, **labels):
        text = httpx.get(stack.url + "/metrics", headers={"Authorization": f"Bearer {client.api_key}"}).text
        return sample(text, name, **labels)

    deadline = time.monotonic() + 30
    while (counted("kiln_inference_requests_total", outcome="completed") or 0) < 1 and time.monotonic() < deadline:
        time.sleep(0.5)
    assert counted("kiln_inference_requests_total", outcome="completed") >= 1
    assert counted("kiln_inference_completion_tokens_total") >= response.usage.completion_tokens


@pytest.mark.parametrize("extra", [{}, {"chat_template_kwargs": {"enable_thinking": False}, "stop": ["0"]}])
def test_streaming_gives_the_same_text_as_non_streaming_token_by_token(served, extra):
    _, client = served
    whole = _ask(client, seed=11, max_tokens=24, **extra)
    stream = _ask(client, seed=11, max_tokens=24, stream=True, **extra)
    content, reasoning, finish, text_chunks = "", "", None, 0
    for chunk in stream:
        for choice in chunk.choices:
            piece = (choice.delta.content or "") + ((choice.delta.model_extra or {}).get("reasoning_content") or "")
            text_chunks += bool(piece)
            content += choice.delta.content or ""
            reasoning += (choice.delta.model_extra or {}).get("reasoning_content") or ""
            finish = choice.finish_reason or finish
    assert content == whole.choices[0].message.content
    assert reasoning == (whole.choices[0].message.model_extra.get("reasoning_content") or "")
    assert finish == whole.choices[0].finish_reason
    if whole.usage.completion_tokens >= 6:
        assert text_chunks >= 2  # the text arrived in pieces as it was sampled, not in one block


def test_same_seed_same_tokens_with_other_requests_in_flight(served):
    _, client = served
    alone = _ask(client, seed=1234, max_tokens=24).choices[0].message.content
    results: dict[int, str] = {}

    def ask(seed):
        results[seed] = _ask(client, seed=seed, max_tokens=24).choices[0].message.content

    threads = [threading.Thread(target=ask, args=(seed,)) for seed in (1234, 1, 2, 3, 4, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=180)
    assert results[1234] == alone
    assert len(set(results.values())) > 1  # other seeds really sampled something else


def test_provenance_records_validate_and_logprobs_match_a_fresh_forward_pass(served, tiny_model_dir):
    from core.contracts.provenance import prompt_messages_sha256, validate_rollout_provenance
    from gpu_runtime.model_loading import load_model

    _, client = served
    response = _ask(client, seed=21, n=2, temperature=1.0, rollout_provenance=True,
                    chat_template_kwargs={"enable_thinking": False})
    loaded = load_model(tiny_model_dir)
    for choice in response.choices:
        record = choice.model_extra["rollout_provenance"]
        validate_rollout_provenance(record)
        assert record["prompt_messages_sha256"] == prompt_messages_sha256(ARITHMETIC)
        assert record["sampling"]["temperature"] == 1.0
        ids = record["input_token_ids"]
        with torch.inference_mode():
            logits = loaded.model(input_ids=torch.tensor([ids])).logits[0].float()
        logprobs = torch.log_softmax(logits, dim=-1)
        for action in record["action_tokens"]:
            if action["source"] == "sampled":
                expected = logprobs[action["sequence_index"] - 1, action["token_id"]].item()
                assert action["behavior_logprob"] == pytest.approx(expected, abs=1e-4)
    assert response.choices[0].model_extra["seed"] != response.choices[1].model_extra["seed"]


def test_adapter_selection_changes_outputs_and_unknown_adapter_is_404(served, tiny_model_dir):
    stack, client = served
    stack.run([sys.executable, "-m", "tests.support.make_adapter", "noisy", str(tiny_model_dir), "3"])
    base = _ask(client, seed=8, temperature=0.0, max_tokens=16, adapter="base")
    tuned = _ask(client, seed=8, temperature=0.0, max_tokens=16, adapter="noisy")
    assert tuned.choices[0].model_extra["adapter"]["name"] == "noisy"
    assert base.choices[0].model_extra["adapter"] is None
    assert tuned.choices[0].message.content != base.choices[0].message.content
    with pytest.raises(openai.NotFoundError) as info:
        _ask(client, seed=8, adapter="never-published")
    assert info.value.body["code"] == "adapter_not_found"


def test_caps_and_bad_requests_answer_clear_codes(served):
    _, client = served
    with pytest.raises(openai.BadRequestError) as info:
        _ask(client, seed=1, n=64)
    assert info.value.body["code"] == "n_too_large"
    with pytest.raises(openai.BadRequestError) as info:
        _ask(client, seed=1, max_tokens=100000)
    assert info.value.body["code"] == "max_tokens_too_large"
    with pytest.raises(openai.UnprocessableEntityError) as info:
        client.chat.completions.create(model="x", messages=[{"role": "wizard", "content": "hi"}])
    assert info.value.body["code"] == "validation_error"
    long_prompt = [{"role": "user", "content": "7 + " * 5000}]
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="x", messages=long_prompt, max_tokens=4)
    assert info.value.body["code"] == "context_length_exceeded"
