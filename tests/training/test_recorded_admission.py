"""Recorded-policy corpora are checked at submission: drift is refused before anything is queued."""

import copy
import json
from types import SimpleNamespace

import pytest
from django.test import Client

from core.accounts.services import token_create, user_create
from core.contracts.provenance import build_rollout_provenance
from core.errors import KilnError
from core.jobs.models import Job
from training.recorded_admission import check_recorded_corpus

SHA = "sha256:" + "ab" * 32
IDENTITY = {"base_model_sha256": SHA, "tokenizer": {"vocab_sha256": SHA, "config_sha256": SHA,
                                                     "chat_template_sha256": SHA}}
MESSAGES = [{"role": "user", "content": "What is 2 + 3?"}]
SAMPLING = {"temperature": 0.9, "top_p": 1.0, "top_k": 0, "min_p": 0.0, "max_tokens": 8,
            "repetition_penalty": 1.0, "presence_penalty": 0.0, "frequency_penalty": 0.0, "stop": []}


def _completion(text: str, seed: int, reward: float) -> dict:
    result = SimpleNamespace(
        prompt_token_ids=[1, 2, 3], completion_token_ids=[7, 8], token_logprobs=[-0.5, -0.25],
        token_sources=["sampled", "sampled"], text=text, seed=seed, generation_backend="kiln-torch",
        behavior_policy={"served_model_id": "tiny", "base_model_sha256": SHA, "inference_config_sha256": SHA,
                         "implementation": "kiln"},
        tokenizer=dict(IDENTITY["tokenizer"]), sampling=dict(SAMPLING), template_invocation={})
    record = build_rollout_provenance(result, prompt_messages=MESSAGES, text=text)
    return {"text": text, "reward": reward, "provenance": record}


def _group():
    return {"messages": copy.deepcopy(MESSAGES),
            "completions": [_completion("5", 42, 1.0), _completion("6", 43, 0.0)]}


def test_a_faithful_corpus_passes():
    assert check_recorded_corpus([_group(), _group()], model_identity=IDENTITY, base_adapter=None) == 4


@pytest.mark.parametrize("edit, drift", [
    (lambda g: g["completions"][1].update(text="5"), "scored_payload drift"),
    (lambda g: g["messages"][0].update(content="What is 2 + 4?"), "prompt_messages drift"),
    (lambda g: g["completions"][1]["provenance"]["sampling"].update(temperature=0.5), "sampling drift"),
    (lambda g: g["completions"][0]["provenance"]["tokenizer"].update(vocab_sha256="sha256:" + "cd" * 32),
     "tokenizer drift"),
    (lambda g: g["completions"][0]["provenance"]["behavior_policy"].update(
        adapter={"name": "other", "content_sha256": SHA}), "adapter drift"),
    (lambda g: g["completions"][0]["provenance"].update(extra_field=1), "schema drift"),
])
def test_each_drift_is_named(edit, drift):
    group = _group()
    edit(group)
    with pytest.raises(KilnError) as info:
        check_recorded_corpus([group], model_identity=IDENTITY, base_adapter=None)
    assert drift in info.value.message
    assert info.value.message.startswith("groups[0].completions[")  # 0-based, as the trainer says too
    assert info.value.status == 400


def test_adapter_must_match_base_adapter():
    group = _group()
    with pytest.raises(KilnError, match="adapter drift"):
        check_recorded_corpus([group], model_identity=IDENTITY, base_adapter={"name": "r1", "content_sha256": SHA})


@pytest.mark.django_db
def test_the_api_refuses_a_hand_edited_recorded_corpus_and_queues_nothing():
    user_create(username="t", password="long-enough-pw")
    api = Client(headers={"Authorization": f"Bearer {token_create(username='t')[1]}"})
    group = _group()
    group["completions"][1]["text"] = "5"  # "fixing" a wrong answer by hand
    response = api.post("/v1/train/grpo", content_type="application/json", data=json.dumps(
        {"groups": [group], "config": {"behavior_policy": "recorded", "output_name": "r1"}}))
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["code"] == "recorded_provenance_drift"
    assert "scored_payload drift" in error["message"]
    assert Job.objects.count() == 0
