"""behavior_policy=recorded: provenance from the project's sampler passes; drift is rejected and named."""

from __future__ import annotations

import copy

import pytest

from core.contracts.provenance import prompt_messages_sha256, scored_payload_sha256
from gpu_runtime.grpo.errors import RecordedProvenanceError
from gpu_runtime.grpo.recorded import verify_recorded_groups
from tests.grpo.tiny_support import arithmetic_tasks, exact_match_reward, run, train_request


def sample_groups(tiny_model_dir, temperature: float):
    """Two arithmetic groups of four completions sampled by the project's sampler, with provenance."""
    import torch

    from core.contracts.provenance import build_rollout_provenance
    from gpu_runtime.model_loading import load_model
    from gpu_runtime.sample_types import SampleRequest
    from gpu_runtime.sampler import Sampler
    from gpu_runtime.sampling import SamplingParams

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        loaded = load_model(tiny_model_dir, device="cpu")
        sampler = Sampler(loaded)
        groups = []
        for g, (question, answer) in enumerate(arithmetic_tasks(2)):
            messages = [{"role": "user", "content": question}]
            requests = [
                SampleRequest(
                    messages=messages,
                    sampling=SamplingParams(temperature=temperature, max_tokens=6),
                    seed=100 * g + i,
                    enable_thinking=False,
                )
                for i in range(4)
            ]
            completions = []
            for result in sampler.generate(requests):
                completions.append(
                    {
                        "text": result.text,
                        "reward": exact_match_reward(result.text, result.finish_reason == "stop", answer),
                        "provenance": build_rollout_provenance(result, prompt_messages=messages),
                    }
                )
            groups.append({"messages": messages, "completions": completions})
    finally:
        torch.set_num_threads(threads)
    return loaded, groups


@pytest.fixture(scope="module")
def recorded(tiny_model_dir):
    return sample_groups(tiny_model_dir, 1.0)


def _drift(groups, loaded, base_adapter=None) -> RecordedProvenanceError:
    with pytest.raises(RecordedProvenanceError) as caught:
        verify_recorded_groups(groups, loaded.tokenizer, loaded.identity, base_adapter)
    return caught.value


def test_valid_records_pass_and_count(recorded):
    loaded, groups = recorded
    summary = verify_recorded_groups(groups, loaded.tokenizer, loaded.identity, None)
    sampled = sum(len(c["provenance"]["action_tokens"]) for g in groups for c in g["completions"])
    assert summary.completion_count == 8 and summary.sampled_action_tokens == sampled
    assert summary.forced_action_tokens == 0 and summary.unique_behavior_sources == 1
    block = summary.to_dict()
    assert block["behavior_sources"][0]["behavior_source_sha256"].startswith("sha256:")
    assert block["behavior_source_manifest_sha256"].startswith("sha256:")


def test_edited_completion_text_is_rejected(recorded):
    loaded, groups = recorded
    edited = copy.deepcopy(groups)
    edited[1]["completions"][2]["text"] += " 42"
    error = _drift(edited, loaded)
    assert error.code == "recorded_provenance_drift" and error.drift == "scored_payload"
    assert (error.group_index, error.completion_index) == (1, 2)
    assert "groups[1].completions[2]" in error.message and "text" in error.message
    # ...even when the editor also re-hashed the payload: the text no longer decodes from the tokens.
    edited[1]["completions"][2]["provenance"]["scored_payload_sha256"] = scored_payload_sha256(
        edited[1]["completions"][2]["text"]
    )
    assert _drift(edited, loaded).drift == "completion_tokens"


def test_changed_prompt_is_rejected(recorded):
    loaded, groups = recorded
    edited = copy.deepcopy(groups)
    edited[0]["messages"][0]["content"] = "What is 1 + 1? Reply with just the number."
    error = _drift(edited, loaded)
    assert error.drift == "prompt_messages" and (error.group_index, error.completion_index) == (0, 0)
    for completion in edited[0]["completions"]:  # re-hashed prompt: the replayed template disagrees
        completion["provenance"]["prompt_messages_sha256"] = prompt_messages_sha256(edited[0]["messages"])
    error = _drift(edited, loaded)
    assert error.drift == "prompt_tokens" and "prompt tokens drifted" in error.message


def test_changed_sampling_controls_are_rejected(recorded, tiny_model_dir, tmp_path, one_thread):
    loaded, groups = recorded
    edited = copy.deepcopy(groups)
    record = edited[0]["completions"][1]["provenance"]
    record["sampling"]["max_tokens"] = len(record["input_token_ids"]) - record["prompt_token_count"] - 1
    error = _drift(edited, loaded)
    assert error.drift == "sampling" and "max_tokens" in error.message

    # One completion's temperature edited: its group's records disagree, so the shared checker
    # (the one admission runs) names it before the model is even needed.
    edited = copy.deepcopy(groups)
    edited[1]["completions"][3]["provenance"]["sampling"]["temperature"] = 0.7
    error = _drift(edited, loaded)
    assert error.drift == "sampling" and (error.group_index, error.completion_index) == (1, 3)
    # The first completion edited: it is the odd one out, so it is the one named (not its neighbour).
    edited = copy.deepcopy(groups)
    edited[1]["completions"][0]["provenance"]["sampling"]["temperature"] = 0.7
    error = _drift(edited, loaded)
    assert (error.group_index, error.completion_index) == (1, 0) and "rest of the group" in error.message

    # The whole group's temperature edited keeps the records self-consistent; the trainer replays
    # the behavior log-probs with the pinned model and rejects it before the first step.
    edited = copy.deepcopy(groups)
    for completion in edited[1]["completions"]:
        completion["provenance"]["sampling"]["temperature"] = 0.7
    verify_recorded_groups(edited, loaded.tokenizer, loaded.identity, None)
    with pytest.raises(RecordedProvenanceError) as caught:
        run(
            train_request(
                tiny_model_dir, edited, tmp_path, "temp", behavior_policy="recorded", dynamic_sampling=False
            )
        )
    assert caught.value.drift == "sampling" and caught.value.group_index == 1
    assert caught.value.receipt["failure_reason"] == "data_schema_error"


def test_identity_drift_is_rejected(recorded):
    loaded, groups = recorded
    edited = copy.deepcopy(groups)
    edited[0]["completions"][0]["provenance"]["tokenizer"]["chat_template_sha256"] = "sha256:" + "0" * 64
    assert _drift(edited, loaded).drift == "tokenizer"
    edited = copy.deepcopy(groups)
    edited[0]["completions"][0]["provenance"]["behavior_policy"]["base_model_sha256"] = "sha256:" + "1" * 64
    assert _drift(edited, loaded).drift == "base_model"
    # Sampled from the base model, but training would start from a warm-start adapter.
    error = _drift(groups, loaded, {"content_sha256": "sha256:" + "2" * 64})
    assert error.drift == "adapter"
    edited = copy.deepcopy(groups)
    edited[0]["completions"][0]["provenance"]["behavior_policy"]["adapter"] = {
        "name": "r1",
        "content_sha256": "sha256:" + "3" * 64,
    }
    assert _drift(edited, loaded, {"content_sha256": "sha256:" + "2" * 64}).drift == "adapter"
    # The same adapter content as the warm start passes.
    only = [{**edited[0], "completions": edited[0]["completions"][:1]}]
    verify_recorded_groups(only, loaded.tokenizer, loaded.identity, {"content_sha256": "sha256:" + "3" * 64})


def test_missing_or_invalid_provenance(recorded):
    loaded, groups = recorded
    edited = copy.deepcopy(groups)
    del edited[1]["completions"][0]["provenance"]
    assert _drift(edited, loaded).code == "recorded_provenance_missing"
    edited = copy.deepcopy(groups)
    edited[0]["completions"][1]["provenance"]["extra"] = 1
    error = _drift(edited, loaded)
    assert error.code == "recorded_provenance_invalid" and "extra" in error.message


def test_recorded_training_uses_the_behavior_logprobs(recorded, tiny_model_dir, tmp_path, one_thread):
    _, groups = recorded
    result = run(
        train_request(
            tiny_model_dir, groups[:1], tmp_path, "rec", behavior_policy="recorded", dynamic_sampling=False
        )
    )
    receipt = result.receipt
    audit = receipt["grpo"]["policy_audit"]
    # One step, on-policy at temperature 1: pi_theta / pi_behavior = 1 up to float rounding.
    assert audit["importance_sampling"]["min_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert audit["importance_sampling"]["max_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert audit["recorded_provenance"]["completion_count"] == 4
    assert audit["recorded_provenance"]["unique_behavior_sources"] == 1
    assert (
        receipt["recorded_behavior_replay"]["checked_tokens"] == audit["importance_sampling"]["action_tokens"]
    )
    assert receipt["recorded_behavior_replay"]["max_abs_logprob_difference"] < 1e-3


def test_the_replay_batched_per_group_matches_one_completion_at_a_time(recorded, tiny_model_dir, tmp_path,
                                                                      one_thread, monkeypatch):
    """The replay runs a group's completions in one right-padded forward, projecting only the rows
    from the first sampled position on; with a logits budget of one row each completion goes alone.
    Both replay every sampled token, and replay it to the recorded log-prob."""
    from gpu_runtime.grpo import recorded as replay

    _, groups = recorded
    receipts = []
    for budget in (replay.REPLAY_LOGITS_BUDGET, 1):
        monkeypatch.setattr(replay, "REPLAY_LOGITS_BUDGET", budget)
        result = run(train_request(tiny_model_dir, groups[:2], tmp_path / str(budget), "rec",
                                   behavior_policy="recorded", dynamic_sampling=False))
        receipts.append(result.receipt["recorded_behavior_replay"])
    batched, alone = receipts
    assert batched["checked_tokens"] == alone["checked_tokens"] > 0
    assert batched["max_abs_logprob_difference"] < 1e-4 and alone["max_abs_logprob_difference"] < 1e-4


def test_the_replay_gives_the_same_evidence_on_every_forward_layout(recorded, tiny_model_dir, tmp_path,
                                                                    one_thread, monkeypatch):
    """The lean forward (a group at a time, its prompt shared) and the transformers forward (a model
    the lean forward does not cover) check the same tokens and replay them to the recorded log-probs
    as closely."""
    from gpu_runtime import lean_decoder
    from gpu_runtime.grpo import recorded as replay

    _, groups = recorded
    layouts = {"lean": {}, "lean, a completion a chunk": {"REPLAY_LOGITS_BUDGET": 1}, "transformers": {}}
    receipts = {}
    for name, settings in layouts.items():
        with monkeypatch.context() as patch:
            for attribute, value in settings.items():
                patch.setattr(replay, attribute, value)
            if name == "transformers":
                def unsupported(model, **_):
                    raise lean_decoder.LeanUnsupported("test: take the transformers forward")
                patch.setattr(lean_decoder, "plan_for", unsupported)
                with pytest.raises(lean_decoder.LeanUnsupported):
                    lean_decoder.plan_for(None)
            result = run(train_request(tiny_model_dir, groups[:2], tmp_path / name.replace(" ", "-"), "rec",
                                       behavior_policy="recorded", dynamic_sampling=False))
        receipts[name] = result.receipt["recorded_behavior_replay"]
        took_transformers = any(f["capability"] == "lean_forward" for f in result.receipt["fallbacks"])
        assert took_transformers == (name == "transformers")
    counts = {r["checked_tokens"] for r in receipts.values()}
    assert len(counts) == 1 and counts.pop() > 0
    assert all(r["max_abs_logprob_difference"] < 1e-4 for r in receipts.values()), receipts


def test_a_replay_drift_names_the_first_completion_of_the_edited_group(recorded, tiny_model_dir, tmp_path,
                                                                       one_thread):
    """A chunk's positions are checked in one pass; the first drifted completion is still the one named."""
    _, groups = recorded
    edited = copy.deepcopy(groups)
    for completion in edited[1]["completions"]:
        completion["provenance"]["sampling"]["temperature"] = 0.5
    with pytest.raises(RecordedProvenanceError) as caught:
        run(train_request(tiny_model_dir, edited, tmp_path, "drift", behavior_policy="recorded",
                          dynamic_sampling=False))
    assert (caught.value.drift, caught.value.group_index, caught.value.completion_index) == ("sampling", 1, 0)


RECORDED_KL = {"behavior_policy": "recorded", "dynamic_sampling": False, "kl_coeff": 0.1, "kl_estimator": "k3"}


def test_base_model_samples_at_temperature_one_are_their_own_kl_reference(recorded, tiny_model_dir, tmp_path,
                                                                          one_thread, monkeypatch):
    """Sampled from the base model at temperature 1, unfiltered, and trained from the base against
    the base: the records already hold the reference's log-probs, so no reference forward runs, and
    the losses and KL figures are those of a run whose reference forward does run."""
    from gpu_runtime.grpo import step

    _, groups = recorded
    reused = run(train_request(tiny_model_dir, groups[:2], tmp_path / "reused", "rec", **RECORDED_KL))
    monkeypatch.setattr(step, "behavior_is_reference", lambda group, sha: False)
    computed = run(train_request(tiny_model_dir, groups[:2], tmp_path / "computed", "rec", **RECORDED_KL))
    reused_path = reused.receipt["runtime"]["execution_provenance"]
    computed_path = computed.receipt["runtime"]["execution_provenance"]
    assert (reused_path["reference_path"], reused_path["reference_reused_groups"]) == ("recorded_behavior", 2)
    assert (computed_path["reference_path"], computed_path["reference_reused_groups"]) == ("shared_prefix", 0)
    pairs = list(zip(reused.receipt["loss_history"], computed.receipt["loss_history"], strict=True))
    assert len(pairs) == 2
    for a, b in pairs:
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["kl_estimator_mean"] == pytest.approx(b["kl_estimator_mean"], abs=1e-6)
    # After one step the policy has moved: the KL the reused reference gives is not trivially 0.
    assert pairs[1][0]["kl_estimator_mean"] > 1e-6


def test_a_reference_that_is_not_the_behavior_policy_still_runs_its_forward(recorded, tiny_model_dir, tmp_path,
                                                                            one_thread):
    """An EMA reference is not the base model the records came from: its forward runs."""
    _, groups = recorded
    ema = run(train_request(tiny_model_dir, groups[:1], tmp_path / "ema", "rec",
                            kl_reference_policy={"kind": "ema", "decay": 0.5, "refresh_every": 1}, **RECORDED_KL))
    provenance = ema.receipt["runtime"]["execution_provenance"]
    assert (provenance["reference_path"], provenance["reference_reused_groups"]) == ("shared_prefix", 0)


@pytest.mark.parametrize(
    "edit",
    [
        {"temperature": 0.7},
        {"top_k": 5},
        {"top_p": 0.9},
        {"min_p": 0.05},
        {"repetition_penalty": 1.1},
        {"presence_penalty": 0.5},
        {"frequency_penalty": 0.5},
        {"adapter": {"name": "a", "content_sha256": "0" * 64}},
        {"inference_config_sha256": "f" * 64},
        {"forced_last_token": True},
    ],
    ids=lambda edit: next(iter(edit)),
)
def test_only_plain_base_model_samples_stand_in_for_the_reference(recorded, edit):
    """Filtered, tempered or penalised sampling draws from another distribution than the model's
    own; an adapter's samples, or samples under another inference configuration, are not the
    trainer's reference; a trained token without a record has nothing to reuse."""
    from types import SimpleNamespace

    from gpu_runtime.grpo.recorded import action_layout, behavior_is_reference

    loaded, groups = recorded
    sha = loaded.identity["inference_config_sha256"]

    def encoded(record):
        positions, behavior = action_layout(record)
        return SimpleNamespace(provenance=record, behavior=behavior, action_positions=positions)

    records = [copy.deepcopy(c["provenance"]) for c in groups[0]["completions"]]
    assert behavior_is_reference(SimpleNamespace(completions=[encoded(r) for r in records]), sha)
    edited = records[-1]
    key, value = next(iter(edit.items()))
    items = [encoded(r) for r in records]
    if key == "adapter":
        edited["behavior_policy"]["adapter"] = value
    elif key == "inference_config_sha256":
        edited["behavior_policy"]["inference_config_sha256"] = value
    elif key == "forced_last_token":
        items[-1].action_positions = items[-1].action_positions + [len(edited["input_token_ids"])]
    else:
        edited["sampling"][key] = value
    assert not behavior_is_reference(SimpleNamespace(completions=items), sha)


@pytest.mark.parametrize("layout", ["lean", "transformers"])
def test_samples_drawn_below_temperature_one_are_on_policy_for_a_fresh_adapter(
    tiny_model_dir, tmp_path, one_thread, monkeypatch, layout
):
    """The behavior log-probs of a completion sampled at temperature 0.7 are those of the tempered
    distribution; the policy and the KL reference are read at the same temperature, so the first
    step's ratio is 1 and its KL 0 (read at temperature 1 they were 0.5-1.6 and tokens were clipped
    as if the data were off-policy)."""
    from gpu_runtime import lean_decoder

    _, groups = sample_groups(tiny_model_dir, 0.7)
    if layout == "transformers":
        def unsupported(model, **_):
            raise lean_decoder.LeanUnsupported("test: take the transformers forward")

        monkeypatch.setattr(lean_decoder, "plan_for", unsupported)
    result = run(train_request(tiny_model_dir, groups[:1], tmp_path, "warm", **RECORDED_KL))
    receipt = result.receipt
    sampling = receipt["grpo"]["policy_audit"]["importance_sampling"]
    assert sampling["min_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert sampling["max_ratio"] == pytest.approx(1.0, abs=1e-4)
    assert sampling["action_tokens"] > 0
    first = receipt["loss_history"][0]
    assert first["kl_estimator_mean"] == pytest.approx(0.0, abs=1e-6)
    took_transformers = any(f["capability"] == "lean_forward" for f in receipt["fallbacks"])
    assert took_transformers == (layout == "transformers")
