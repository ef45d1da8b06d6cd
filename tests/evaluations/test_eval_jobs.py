"""Eval jobs, pure parts: the payload, seed derivation, the effective-generation hash, the generation
settings' bounds, rerun selection, the replay comparison, the request body and the provenance checks."""

from __future__ import annotations

import copy

import pytest

from core.contracts.sampling import MAX_SEED
from core.errors import KilnError
from evaluations.eval_payloads import (
    EvalJobPayload,
    PayloadError,
    default_seed,
    example_seed,
    generation_hash,
    parse_generation,
    replay_verdict,
    rerun_kinds,
    select_examples,
)

SUITE_HASH = "sha256:" + "a" * 64
MODEL = {"base_model_sha256": "sha256:" + "b" * 64, "inference_config_sha256": "sha256:" + "c" * 64,
         "tokenizer": {"vocab_sha256": "sha256:" + "d" * 64, "config_sha256": "sha256:" + "e" * 64,
                       "chat_template_sha256": "sha256:" + "f" * 64}}


def _payload(**overrides) -> dict:
    generation = parse_generation({"seed": 7}, suite_hash=SUITE_HASH)
    data = {"mode": "run", "suite": {"name": "math", "suite_hash": SUITE_HASH, "source_suite_hash": SUITE_HASH,
                                     "source": "registered", "path": "/x/suite.json", "sha256": SUITE_HASH,
                                     "examples": 5, "scorers": {}},
            "targets": [{"adapter": None, "content_sha256": None}], "generation": generation, "model": MODEL,
            "effective_generation_hash": generation_hash(generation, MODEL), "origin": None, "route": "/v1/eval/run",
            "extra": {}}
    data.update(overrides)
    return data


def test_payload_round_trips_and_refuses_bad_shapes():
    data = _payload()
    payload = EvalJobPayload.from_dict(data)
    assert payload.to_dict() == data and EvalJobPayload.from_dict(payload.to_dict()) == payload
    assert payload.seed == 7 and payload.labels == ["base"]
    compare = EvalJobPayload.from_dict(_payload(mode="compare", targets=[{"adapter": None}, {"adapter": "a1",
                                                                                          "content_sha256": "x"}]))
    assert compare.labels == ["base", "a1"] and compare.targets[0] == {"adapter": None, "content_sha256": None}
    with pytest.raises(ValueError, match="mode"):
        EvalJobPayload.from_dict(_payload(mode="bogus"))
    with pytest.raises(ValueError, match="targets"):
        EvalJobPayload.from_dict(_payload(targets=[{"adapter": None}] * 9))
    with pytest.raises(ValueError, match="targets"):
        EvalJobPayload.from_dict(_payload(targets=[]))
    broken = _payload()
    del broken["suite"]["sha256"]
    with pytest.raises(ValueError, match="suite.sha256"):
        EvalJobPayload.from_dict(broken)


def test_generation_defaults_and_bounds():
    generation = parse_generation(None, suite_hash=SUITE_HASH)
    assert generation["temperature"] == 0.0 and generation["max_tokens"] == 256 and generation["top_p"] == 1.0
    assert generation["thinking"] is False and generation["thinking_budget_tokens"] is None
    assert generation["seed"] == str(default_seed(SUITE_HASH)) and generation["seed_source"] == "derived"
    assert parse_generation({"seed": "18446744073709551615"}, suite_hash=SUITE_HASH)["seed"] == str(MAX_SEED)
    assert parse_generation({"seed": 3, "stop": "\n"}, suite_hash=SUITE_HASH)["stop"] == ["\n"]
    for bad, field in [({"top_p": 0}, "generation.top_p"), ({"temperature": 2.5}, "generation.temperature"),
                       ({"max_tokens": 0}, "generation.max_tokens"), ({"max_tokens": 5000}, "generation.max_tokens"),
                       ({"max_tokens": 1.5}, "generation.max_tokens"), ({"top_k": -1}, "generation.top_k"),
                       ({"temperature": float("nan")}, "generation.temperature"),
                       ({"stop": ["a"] * 9}, "generation.stop"), ({"stop": [""]}, "generation.stop"),
                       ({"seed": -1}, "generation.seed"), ({"seed": str(MAX_SEED + 1)}, "generation.seed"),
                       ({"seed": "12x"}, "generation.seed"), ({"thinking": "yes"}, "generation.thinking"),
                       ({"thinking_budget_tokens": 5}, "generation.thinking_budget_tokens"),
                       ({"tempreature": 1}, "generation.tempreature"), ("hot", "generation")]:
        with pytest.raises(PayloadError) as caught:
            parse_generation(bad, suite_hash=SUITE_HASH)
        assert caught.value.field == field, (bad, caught.value)
    assert parse_generation({"thinking": True, "thinking_budget_tokens": 5},
                            suite_hash=SUITE_HASH)["thinking_budget_tokens"] == 5


def test_seed_derivation_is_deterministic_and_spread():
    assert default_seed(SUITE_HASH) == default_seed(SUITE_HASH)
    assert default_seed(SUITE_HASH) != default_seed("sha256:" + "0" * 64)
    seeds = {example_seed(7, f"ex-{i}") for i in range(200)}
    assert len(seeds) == 200 and all(0 <= s <= MAX_SEED for s in seeds)
    assert example_seed(7, "ex-1") == example_seed(7, "ex-1")
    assert example_seed(7, "ex-1") != example_seed(8, "ex-1")
    assert example_seed(MAX_SEED, "x") <= MAX_SEED


def test_generation_hash_binds_every_setting_and_the_model_but_not_key_order():
    base = parse_generation({"seed": 7}, suite_hash=SUITE_HASH)
    reference = generation_hash(base, MODEL)
    assert reference.startswith("sha256:") and len(reference) == 71
    reordered = dict(reversed(list(base.items())))
    assert generation_hash(reordered, dict(reversed(list(MODEL.items())))) == reference
    explicit = parse_generation({"seed": "7", "temperature": 0, "max_tokens": 256, "top_p": 1, "stop": [],
                                 "thinking": False}, suite_hash=SUITE_HASH)
    assert generation_hash(explicit, MODEL) == reference  # an omitted field hashes like its default
    changes = [{"temperature": 0.5}, {"max_tokens": 64}, {"top_p": 0.9}, {"top_k": 5}, {"min_p": 0.1},
               {"repetition_penalty": 1.1}, {"presence_penalty": 0.5}, {"frequency_penalty": -0.5},
               {"stop": ["\n"]}, {"seed": 8}, {"thinking": True}, {"thinking": True, "thinking_budget_tokens": 9}]
    hashes = {reference}
    for change in changes:
        hashes.add(generation_hash(parse_generation({"seed": 7, **change}, suite_hash=SUITE_HASH), MODEL))
    assert len(hashes) == len(changes) + 1
    for key in ("base_model_sha256", "inference_config_sha256"):
        assert generation_hash(base, {**MODEL, key: "sha256:" + "9" * 64}) != reference
    other_template = copy.deepcopy(MODEL)
    other_template["tokenizer"]["chat_template_sha256"] = "sha256:" + "9" * 64
    assert generation_hash(base, other_template) != reference
    # The derived seed and a request for the same number hash alike: seed_source is not bound.
    derived = parse_generation(None, suite_hash=SUITE_HASH)
    same = parse_generation({"seed": int(derived["seed"])}, suite_hash=SUITE_HASH)
    assert generation_hash(derived, MODEL) == generation_hash(same, MODEL)


def test_rerun_selection():
    assert rerun_kinds(None, False) == ("fail", "invalid", "error")
    assert rerun_kinds(None, True) == ("pass", "fail", "invalid", "error")
    assert rerun_kinds(["invalid"], False) == ("invalid",)
    with pytest.raises(PayloadError, match="'bogus'"):
        rerun_kinds(["bogus"], False)
    with pytest.raises(PayloadError) as caught:
        rerun_kinds([], False)
    assert caught.value.field == "outcome_kinds"
    with pytest.raises(PayloadError):
        rerun_kinds("fail", False)
    records = [{"target_index": 0, "example_id": "a", "outcome": "pass"},
               {"target_index": 0, "example_id": "b", "outcome": "fail"},
               {"target_index": 0, "example_id": "c", "outcome": "error"},
               {"target_index": 1, "example_id": "a", "outcome": "invalid"},
               {"target_index": 1, "example_id": "b", "outcome": "fail"}]
    assert select_examples(records, ("fail", "invalid", "error")) == ["b", "c", "a"]
    assert select_examples(records, ("pass",)) == ["a"]
    assert select_examples(records, ("invalid",)) == ["a"]


def _rec(example_id, completion, tokens, target_index=0, finish="stop"):
    return {"target_index": target_index, "target": "base", "example_id": example_id, "completion": completion,
            "completion_token_ids": tokens, "finish_reason": finish}


def test_replay_verdict():
    original = [_rec("a", "12", [1, 2]), _rec("b", "7", [7])]
    assert replay_verdict(original, copy.deepcopy(original)) == {"status": "matched", "compared": 2}
    drift = [_rec("a", "12", [1, 2]), _rec("b", "8", [8, 3])]
    verdict = replay_verdict(original, drift)
    assert verdict["status"] == "mismatch" and verdict["compared"] == 2
    first = verdict["first_mismatch"]
    assert first["example_id"] == "b" and first["token_index"] == 0 and first["char_index"] == 0
    assert first["expected_token"] == 7 and first["got_token"] == 8
    longer = replay_verdict(original, [_rec("a", "123", [1, 2, 3]), _rec("b", "7", [7])])["first_mismatch"]
    assert longer["example_id"] == "a" and longer["token_index"] == 2 and longer["char_index"] == 2
    no_tokens = replay_verdict([_rec("a", "abc", None)], [_rec("a", "abd", None)])["first_mismatch"]
    assert no_tokens["token_index"] is None and no_tokens["char_index"] == 2
    finish = replay_verdict([_rec("a", "x", [1])], [_rec("a", "x", [1], finish="length")])
    assert finish["status"] == "mismatch" and finish["first_mismatch"]["token_index"] is None
    assert replay_verdict(original, original[:1])["status"] == "error"


def test_request_body_and_provenance_checks():
    from evaluations.eval_jobs import check_provenance, outcome_table, request_body, summarize

    generation = parse_generation({"seed": 7, "thinking": True, "thinking_budget_tokens": 4}, suite_hash=SUITE_HASH)
    example = {"id": "e1", "messages": [{"role": "user", "content": "2+2?"}]}
    body = request_body(example, adapter="a1", generation=generation, seed=99)
    assert body["seed"] == 99 and body["adapter"] == "a1" and body["rollout_provenance"] is True
    assert body["chat_template_kwargs"] == {"enable_thinking": True} and body["thinking_budget_tokens"] == 4
    assert body["n"] == 1 and body["stream"] is False and body["temperature"] == 0.0 and body["max_tokens"] == 256
    from adapters.serving.sync_client import validate_body

    validate_body(body)  # the server's own parse accepts it

    provenance = {"seed": 99, "input_token_ids": [5, 6, 7, 8], "prompt_token_count": 2,
                  "behavior_policy": {"base_model_sha256": MODEL["base_model_sha256"],
                                      "inference_config_sha256": MODEL["inference_config_sha256"],
                                      "adapter": {"name": "a1", "content_sha256": "sha256:" + "1" * 64}}}
    target = {"adapter": "a1", "content_sha256": "sha256:" + "1" * 64}
    assert check_provenance(provenance, seed=99, model=MODEL, target=target) == [7, 8]
    assert check_provenance(None, seed=99, model=MODEL, target=target) is None
    for broken, code in [({"seed": 98}, "eval_seed_mismatch"),
                         ({"behavior_policy": {**provenance["behavior_policy"], "base_model_sha256": "sha256:" + "0" * 64}},
                          "eval_model_changed")]:
        with pytest.raises(KilnError) as caught:
            check_provenance({**provenance, **broken}, seed=99, model=MODEL, target=target)
        assert caught.value.code == code
    with pytest.raises(KilnError) as caught:
        check_provenance(provenance, seed=99, model=MODEL, target={**target, "content_sha256": "sha256:" + "2" * 64})
    assert caught.value.code == "eval_adapter_changed"
    with pytest.raises(KilnError) as caught:
        check_provenance(provenance, seed=99, model=MODEL, target={"adapter": None, "content_sha256": None})
    assert caught.value.code == "eval_adapter_changed"

    records = [{"target_index": 0, "example_id": "a", "outcome": "pass"},
               {"target_index": 0, "example_id": "b", "outcome": "fail"},
               {"target_index": 1, "example_id": "a", "outcome": "pass"},
               {"target_index": 1, "example_id": "b", "outcome": "invalid"}]
    summary = summarize(records, ["base", "a1"])
    assert summary["counts"] == {"pass": 2, "fail": 1, "invalid": 1, "error": 0} and summary["accuracy"] == 0.5
    assert summary["targets"][1]["counts"]["invalid"] == 1 and summary["targets"][0]["accuracy"] == 0.5
    assert outcome_table(records, 2) == [{"example_id": "a", "outcomes": ["pass", "pass"], "agree": True},
                                         {"example_id": "b", "outcomes": ["fail", "invalid"], "agree": False}]
