"""kiln.rollout-provenance.v1: built from sampler results, validated strictly (reference-spec §2.3)."""

from __future__ import annotations

import copy

import pytest

from core.canonical import json_digest
from core.contracts.provenance import (
    ProvenanceError,
    build_rollout_provenance,
    prompt_messages_sha256,
    scored_payload_sha256,
    validate_rollout_provenance,
)
from gpu_runtime.sample_types import SampleRequest
from gpu_runtime.sampling import SamplingParams

MESSAGES = [{"role": "user", "content": "What is 47 + 13? Reply with just the number."}]


@pytest.fixture(scope="module")
def results(sampler):
    plain = SampleRequest(
        messages=MESSAGES,
        enable_thinking=False,
        seed=42,
        sampling=SamplingParams(temperature=0.9, max_tokens=8, stop=["\n\n\n"]),
    )
    budget = SampleRequest(
        messages=MESSAGES,
        enable_thinking=True,
        seed=43,
        thinking_budget_tokens=1,
        sampling=SamplingParams(max_tokens=8),
    )
    return sampler.generate([plain, budget])


@pytest.fixture
def record(results):
    return build_rollout_provenance(results[0], prompt_messages=MESSAGES)


def test_record_layout_and_values(record, results, loaded):
    result = results[0]
    assert list(record) == [
        "schema",
        "input_token_ids",
        "prompt_token_count",
        "prompt_messages_sha256",
        "scored_payload_sha256",
        "action_tokens",
        "behavior_policy",
        "tokenizer",
        "sampling",
        "seed",
        "generation_backend",
        "template_invocation",
    ]
    assert record["schema"] == "kiln.rollout-provenance.v1"
    assert record["input_token_ids"] == result.prompt_token_ids + result.completion_token_ids
    assert record["prompt_token_count"] == len(result.prompt_token_ids)
    assert record["prompt_messages_sha256"] == json_digest(MESSAGES) == prompt_messages_sha256(MESSAGES)
    assert record["scored_payload_sha256"] == json_digest(
        {"schema": "kiln.scored-rollout-payload.v1", "text": result.text, "trajectory": []}
    )
    assert [a["sequence_index"] for a in record["action_tokens"]] == list(
        range(len(result.prompt_token_ids), len(record["input_token_ids"]))
    )
    assert [a["behavior_logprob"] for a in record["action_tokens"]] == result.token_logprobs
    assert record["sampling"] == {
        "temperature": 0.9,
        "top_p": 1.0,
        "top_k": 0,
        "min_p": 0.0,
        "max_tokens": 8,
        "repetition_penalty": 1.0,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "stop": ["\n\n\n"],
    }
    assert record["seed"] == 42 and record["generation_backend"] == "torch-cpu"
    assert record["tokenizer"] == loaded.identity["tokenizer"]
    assert record["behavior_policy"]["base_model_sha256"] == loaded.identity["base_model_sha256"]
    assert record["template_invocation"] == {"template_kwargs": {"enable_thinking": False}}


def test_scored_payload_can_name_a_trajectory(results):
    trajectory = [{"role": "assistant", "content": "60", "kind": "action"}]
    record = build_rollout_provenance(results[0], prompt_messages=MESSAGES, text="60", trajectory=trajectory)
    assert record["scored_payload_sha256"] == scored_payload_sha256("60", trajectory)
    assert record["scored_payload_sha256"] != scored_payload_sha256("60")


def test_forced_tokens_need_a_budget_that_lists_them(results):
    record = build_rollout_provenance(results[1], prompt_messages=MESSAGES)
    forced = [a for a in record["action_tokens"] if a["source"] == "forced"]
    assert forced and all(a["behavior_logprob"] is None for a in forced)
    budget = record["sampling"]["thinking_budget"]
    assert budget["max_tokens"] == 1 and {a["token_id"] for a in forced} <= set(budget["close_token_ids"])
    no_budget = copy.deepcopy(record)
    del no_budget["sampling"]["thinking_budget"]
    with pytest.raises(ProvenanceError, match="thinking_budget"):
        validate_rollout_provenance(no_budget)
    wrong_ids = copy.deepcopy(record)
    wrong_ids["sampling"]["thinking_budget"]["close_token_ids"] = [999999]
    with pytest.raises(ProvenanceError, match="close_token_ids"):
        validate_rollout_provenance(wrong_ids)
    forced_logprob = copy.deepcopy(record)
    next(a for a in forced_logprob["action_tokens"] if a["source"] == "forced")["behavior_logprob"] = -1.0
    with pytest.raises(ProvenanceError, match="must not carry"):
        validate_rollout_provenance(forced_logprob)


def _mutations():
    def put(path, value):
        def apply(rec):
            target = rec
            for key in path[:-1]:
                target = target[key]
            target[path[-1]] = value

        return apply

    def drop(path):
        def apply(rec):
            target = rec
            for key in path[:-1]:
                target = target[key]
            del target[path[-1]]

        return apply

    return {
        "unknown top-level field": put(("extra",), 1),
        "unknown action field": put(("action_tokens", 0, "note"), "x"),
        "unknown policy field": put(("behavior_policy", "region"), "eu"),
        "unknown tokenizer field": put(("tokenizer", "merges_sha256"), "sha256:" + "0" * 64),
        "unknown sampling field": put(("sampling", "typical_p"), 0.5),
        "unknown invocation field": put(("template_invocation", "documents"), []),
        "unknown adapter field": put(
            ("behavior_policy", "adapter"), {"name": "a", "content_sha256": "sha256:" + "1" * 64, "rev": 2}
        ),
        "missing field": drop(("seed",)),
        "wrong schema": put(("schema",), "kiln.rollout-provenance.v2"),
        "prompt count zero": put(("prompt_token_count",), 0),
        "index inside the prompt": put(("action_tokens", 0, "sequence_index"), 0),
        "token id drift": put(("action_tokens", 0, "token_id"), 999999),
        "sampled without logprob": put(("action_tokens", 0, "behavior_logprob"), None),
        "positive logprob": put(("action_tokens", 0, "behavior_logprob"), 0.5),
        "no action tokens": put(("action_tokens",), []),
        "bad digest": put(("prompt_messages_sha256",), "sha256:ABC"),
        "bad backend text": put(("generation_backend",), " torch "),
        "negative seed": put(("seed",), -1),
        "bool as integer": put(("sampling", "top_k"), True),
        "bool as a prompt token": put(("input_token_ids", 0), True),
        "prompt token above 32 bits": put(("input_token_ids", 1), 1 << 32),
        "negative prompt token": put(("input_token_ids", 1), -1),
        "float prompt token": put(("input_token_ids", 1), 3.0),
        "top_p above one": put(("sampling", "top_p"), 1.5),
        "zero max_tokens": put(("sampling", "max_tokens"), 0),
        "empty stop": put(("sampling", "stop"), [""]),
        "penalty out of range": put(("sampling", "presence_penalty"), 2.5),
        "budget without limit": put(("sampling", "thinking_budget"), {"close_token_ids": [1]}),
    }


@pytest.mark.parametrize("name", sorted(_mutations()))
def test_invalid_records_are_rejected(record, name):
    validate_rollout_provenance(record)
    broken = copy.deepcopy(record)
    _mutations()[name](broken)
    with pytest.raises(ProvenanceError):
        validate_rollout_provenance(broken)


def test_a_bad_token_id_is_named(record):
    broken = copy.deepcopy(record)
    broken["input_token_ids"][2] = "7"
    with pytest.raises(ProvenanceError, match=r"input_token_ids\[\] must be an unsigned 32-bit integer"):
        validate_rollout_provenance(broken)


def test_indexes_must_strictly_increase(results):
    broken = build_rollout_provenance(results[1], prompt_messages=MESSAGES)  # >= 3 action tokens
    broken["action_tokens"][0], broken["action_tokens"][1] = (
        broken["action_tokens"][1],
        broken["action_tokens"][0],
    )
    with pytest.raises(ProvenanceError, match="strictly increase"):
        validate_rollout_provenance(broken)


def test_tiny_top_p_still_gives_a_valid_record(sampler):
    """top_p 1e-200 keeps only the most likely token; the record it yields must still validate
    (it once failed provenance and answered 500 inference_failed)."""
    request = SampleRequest(messages=MESSAGES, enable_thinking=False, seed=5,
                            sampling=SamplingParams(temperature=0.9, top_p=1e-200, max_tokens=4))
    (result,) = sampler.generate([request])
    record = build_rollout_provenance(result, prompt_messages=MESSAGES)
    validate_rollout_provenance(record)
    assert record["sampling"]["top_p"] == 1e-200
    sampled = [token for token in record["action_tokens"] if token["source"] == "sampled"]
    assert sampled and all(token["behavior_logprob"] == 0.0 for token in sampled)
