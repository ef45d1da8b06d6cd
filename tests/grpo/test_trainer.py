"""The GRPO trainer loop on the tiny model: KL reference, shared prefix, receipts, writer lock, cancellation."""

from __future__ import annotations

import json
from contextlib import contextmanager

import pytest
import torch
from safetensors.torch import load_file

from gpu_runtime.grpo.errors import TrainingError
from tests.grpo.tiny_support import fixed_groups, run, train_request


def test_kl_is_exactly_zero_for_a_fresh_adapter_and_positive_after_a_step(
    tiny_model_dir, tmp_path, one_thread
):
    # Batched reference path: the same forward as the policy, with the adapter disabled. A fresh
    # LoRA has B = 0, so the policy is the base model bit for bit.
    result = run(
        train_request(
            tiny_model_dir, fixed_groups(2), tmp_path, "kl", kl_estimator="k3", shared_prefix_reference=False
        )
    )
    first, second = result.receipt["loss_history"]
    assert first["kl_mean"] == 0.0 and first["kl_estimator_mean"] == 0.0
    assert second["kl_estimator_mean"] > 0  # k3 >= 0, and the policy moved away from the base
    audit = result.receipt["grpo"]["policy_audit"]["kl_reference"]
    assert audit["token_observations"] > 0 and audit["mean_estimator"] > 0
    assert result.receipt["runtime"]["execution_provenance"]["reference_path"] == "batched"


def test_reference_is_the_base_model_not_the_warm_started_policy(tiny_model_dir, tmp_path, one_thread):
    first = run(
        train_request(tiny_model_dir, fixed_groups(2), tmp_path, "warm", shared_prefix_reference=False)
    )
    warm = run(
        train_request(
            tiny_model_dir,
            fixed_groups(1),
            tmp_path,
            "from-warm",
            kl_estimator="k3",
            shared_prefix_reference=False,
            request_kwargs={"base_adapter_dir": first.adapter_path, "base_adapter_name": "warm"},
        )
    )
    # At its first step the policy is the warm-start adapter; the reference (adapter disabled) is
    # the base, so the KL is already positive.
    assert warm.receipt["loss_history"][0]["kl_estimator_mean"] > 0
    base = warm.receipt["adapters"]["base"]
    assert (
        base["name"] == "warm"
        and base["adapter_model_sha256"] == first.receipt["adapters"]["output"]["adapter_model_sha256"]
    )


def test_shared_prefix_reference_gives_the_same_loss_as_per_completion(tiny_model_dir, tmp_path, one_thread):
    shared = run(
        train_request(tiny_model_dir, fixed_groups(3), tmp_path, "shared", shared_prefix_reference=True)
    )
    batched = run(
        train_request(tiny_model_dir, fixed_groups(3), tmp_path, "batched", shared_prefix_reference=False)
    )
    assert shared.receipt["runtime"]["execution_provenance"]["reference_path"] == "shared_prefix"
    assert batched.receipt["runtime"]["execution_provenance"]["reference_path"] == "batched"
    for a, b in zip(shared.receipt["loss_history"], batched.receipt["loss_history"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["kl_mean"] == pytest.approx(b["kl_mean"], abs=1e-5)
    assert shared.receipt["fallbacks"] == [] and batched.receipt["fallbacks"] == []


def test_receipt_blocks_and_published_adapter(tiny_model_dir, tmp_path, one_thread):
    groups = fixed_groups(3)
    groups.append(
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "completions": [{"text": "a", "reward": 1.0}, {"text": "b", "reward": 1.0}],
        }
    )  # degenerate
    progress = []
    result = run(
        train_request(
            tiny_model_dir,
            groups,
            tmp_path,
            "receipt",
            adapter_smoke_test=True,
            adapter_smoke_prompts=["What is 2 + 2? Reply with just the number."],
        ),
        progress=progress,
    )
    path = tmp_path / "receipt"
    assert result.adapter_path == path and not result.stopped
    assert sorted(p.name for p in path.iterdir()) == [
        "adapter_config.json",
        "adapter_model.safetensors",
        "train_receipt.json",
    ]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no staging left behind
    receipt = json.loads((path / "train_receipt.json").read_text())
    assert receipt == json.loads(json.dumps(result.receipt))
    assert receipt["status"] == "success" and receipt["receipt_type"] == "kiln_train_receipt"
    assert receipt["data"]["groups_read"] == 4 and receipt["data"]["groups_trained"] == 3
    assert receipt["grpo"]["dynamic_groups_filtered"] == 1
    assert receipt["rewards"]["degenerate_group_count"] == 1 and receipt["rewards"]["count"] == 14
    assert receipt["token_counts"]["action_tokens"] > 0
    assert receipt["grpo"]["policy_audit"]["schema"] == "kiln.grpo-policy-audit.v1"
    assert (
        receipt["grpo"]["policy_audit"]["importance_sampling"]["min_ratio"] == 1.0
    )  # no importance correction
    assert receipt["grpo"]["policy_audit"]["importance_sampling"]["max_ratio"] == 1.0
    assert len(receipt["loss_history"]) == 3 and len(receipt["lora_grad_norms"]) == 3
    assert receipt["lora_delta_norms"] and all(n["norm"] > 0 for n in receipt["lora_delta_norms"])
    assert receipt["adapters"]["output"]["adapter_model_sha256"].startswith("sha256:")
    assert receipt["config"]["seed"] == "7" and receipt["config"]["optimizer"]["kind"] == "adam_w"
    assert receipt["model"]["base_model_sha256"].startswith("sha256:")
    assert set(receipt["tokenizer"]) >= {"config_hash", "chat_template_hash"}
    timings = receipt["phase_timings"]
    for key in (
        "tokenize_ms",
        "reference_forward_ms",
        "policy_forward_ms",
        "backward_ms",
        "optimizer_ms",
        "gpu_writer_wait_ms",
        "gpu_writer_held_ms",
        "gpu_writer_acquisitions",
    ):
        assert key in timings
    smoke = receipt["adapter_smoke_test"]
    assert smoke["prompts"] == 1 and "base" in smoke["results"][0]
    assert [p["step"] for p in progress] == [1, 2, 3]
    assert progress[0]["total_steps"] == 3 and progress[0]["filtered_groups"] == 1
    assert {"loss", "reward_mean", "kl_mean", "grad_norm"} <= set(progress[0])


def test_gpu_writer_is_held_for_gpu_work_and_released_for_callbacks(tiny_model_dir, tmp_path, one_thread):
    state = {"held": False, "enters": 0}

    @contextmanager
    def writer():
        assert not state["held"]
        state["held"] = True
        state["enters"] += 1
        try:
            yield
        finally:
            state["held"] = False

    calls = []

    def on_progress(p):
        calls.append(state["held"])

    from gpu_runtime.grpo.trainer import train_grpo

    result = train_grpo(
        train_request(tiny_model_dir, fixed_groups(4), tmp_path, "lock", checkpoint_interval=2),
        on_progress=on_progress,
        should_stop=lambda: False,
        gpu_writer=writer,
    )
    assert calls == [False] * 6  # 4 group reports + 2 checkpoint reports, none under the writer lock
    # setup + 4 groups + 2 checkpoint snapshots + final work
    assert state["enters"] == result.receipt["phase_timings"]["gpu_writer_acquisitions"] == 8
    assert [p.name for p in result.checkpoints] == [
        "lock-checkpoint-step-00000002.kiln-checkpoint",
        "lock-checkpoint-step-00000004.kiln-checkpoint",
    ]


def test_cancellation_publishes_a_checkpoint_and_a_failure_receipt(tiny_model_dir, tmp_path, one_thread):
    result = run(train_request(tiny_model_dir, fixed_groups(4), tmp_path, "cancel"), stop_after=2)
    assert result.stopped and result.adapter_path is None and result.final_step == 2
    assert [p.name for p in result.checkpoints] == ["cancel-checkpoint-step-00000002.kiln-checkpoint"]
    assert not (tmp_path / "cancel").exists()
    receipt = json.loads(result.receipt_path.read_text())
    assert receipt["status"] == "failed" and receipt["failure_reason"] == "cancelled"
    assert len(receipt["loss_history"]) == 2


def test_a_stop_while_the_data_is_prepared_ends_the_run_before_the_model_is_set_up(
    tiny_model_dir, tmp_path, one_thread, monkeypatch
):
    """A cancel or a shutdown that comes while a large corpus is read and encoded ends the run there
    (a stopped result and a cancelled receipt), not after the model, the replay and the first group."""
    from gpu_runtime.grpo import trainer

    def never(self):
        raise AssertionError("_setup ran after the stop")

    monkeypatch.setattr(trainer._Run, "_setup", never)
    result = trainer.train_grpo(train_request(tiny_model_dir, fixed_groups(4), tmp_path, "early"),
                                on_progress=lambda _: None, should_stop=lambda: True)
    assert result.stopped and result.adapter_path is None and result.final_step == 0 and result.checkpoints == []
    receipt = json.loads(result.receipt_path.read_text())
    assert receipt["status"] == "failed" and receipt["failure_reason"] == "cancelled"
    assert not (tmp_path / "early").exists()


def test_a_stop_while_the_corpus_is_encoded_ends_the_run_between_groups(tiny_model_dir, tmp_path, one_thread,
                                                                        monkeypatch):
    """The passes over the corpus (recorded checks, encoding, the behavior replay) ask between groups:
    a shutdown then ends the run there, within the worker's grace, instead of after the whole corpus
    (a 400-group corpus outlasted the 30 s grace and left its job `running`)."""
    from gpu_runtime.grpo import trainer

    def never(self):
        raise AssertionError("_setup ran after the stop")

    monkeypatch.setattr(trainer._Run, "_setup", never)
    calls = []

    def stop_on_second_call():
        calls.append(1)
        return len(calls) >= 2

    result = trainer.train_grpo(train_request(tiny_model_dir, fixed_groups(6), tmp_path, "mid-encode"),
                                on_progress=lambda _: None, should_stop=stop_on_second_call)
    assert result.stopped and result.adapter_path is None and result.final_step == 0
    assert len(calls) == 2  # asked before group 0 and group 1 of the encoding, and stopped there
    receipt = json.loads(result.receipt_path.read_text())
    assert receipt["status"] == "failed" and receipt["failure_reason"] == "cancelled"


def test_failures_write_a_receipt(tiny_model_dir, tmp_path, one_thread):
    degenerate = [
        {
            "messages": [{"role": "user", "content": "Hi"}],
            "completions": [{"text": "a", "reward": 0.0}, {"text": "b", "reward": 0.0}],
        }
    ]
    with pytest.raises(TrainingError) as caught:
        run(train_request(tiny_model_dir, degenerate, tmp_path, "empty"))
    assert caught.value.code == "zero_groups"
    receipt = json.loads(open(caught.value.receipt_path).read())
    assert receipt["status"] == "failed" and receipt["failure_reason"] == "zero_groups"
    assert not (tmp_path / "empty").exists()

    acquisitions = []

    @contextmanager
    def failing_writer():
        acquisitions.append(1)
        if len(acquisitions) == 3:  # setup, group 1, then the GPU "fails" on group 2
            raise RuntimeError("device lost")
        yield

    with pytest.raises(TrainingError) as caught:
        run(train_request(tiny_model_dir, fixed_groups(3), tmp_path, "broken"), gpu_writer=failing_writer)
    assert caught.value.code == "training_error" and "device lost" in caught.value.message
    receipt = caught.value.receipt
    assert receipt["failure_reason"] == "training_error" and len(receipt["loss_history"]) == 1
    assert not (tmp_path / "broken").exists()


def test_muon_sgd_and_per_sample_aggregation_train(tiny_model_dir, tmp_path, one_thread):
    muon = run(
        train_request(
            tiny_model_dir, fixed_groups(2), tmp_path, "muon", optimizer={"kind": "muon"}, learning_rate=2e-3
        )
    )
    assert muon.final_step == 2 and all(n["norm"] > 0 for n in muon.receipt["lora_delta_norms"])
    per_sample = run(
        train_request(
            tiny_model_dir,
            fixed_groups(2),
            tmp_path,
            "per-sample",
            optimizer={"kind": "sgd"},
            learning_rate=0.05,
            loss_aggregation="per_sample",
        )
    )
    assert per_sample.final_step == per_sample.total_steps == 8  # one step per completion
    weights = load_file(str(per_sample.adapter_path / "adapter_model.safetensors"))
    assert any(torch.count_nonzero(v) for k, v in weights.items() if "lora_B" in k)


def test_trajectory_observations_train_echo(tiny_model_dir, tmp_path, one_thread):
    def rollout(answer, reward):
        return {
            "text": answer,
            "reward": reward,
            "trajectory": [
                {"role": "assistant", "content": "<tool_call>add</tool_call>", "kind": "action"},
                {
                    "role": "tool",
                    "content": "WARNING: slow\nresult 5",
                    "kind": "observation",
                    "warning_prefix_len": 14,
                },
                {"role": "assistant", "content": answer, "kind": "action"},
            ],
        }

    groups = [
        {
            "messages": [{"role": "user", "content": "What is 2 + 3?"}],
            "completions": [rollout("5", 1.0), rollout("6", 0.0), rollout("7", 0.0)],
        }
    ]
    result = run(train_request(tiny_model_dir, groups, tmp_path, "echo"))
    receipt = result.receipt
    assert receipt["echo"]["enabled"] is True and receipt["echo"]["initial_env_ce"] > 0
    counts = receipt["token_counts"]
    assert counts["env_tokens"] > 0 and counts["warning_tokens_filtered"] > 0
    assert (
        counts["env_tokens_before_warning_filter"] == counts["env_tokens"] + counts["warning_tokens_filtered"]
    )


def test_invalid_groups_and_existing_output_are_refused(tiny_model_dir, tmp_path, one_thread):
    with pytest.raises(TrainingError) as caught:
        run(
            train_request(
                tiny_model_dir,
                [{"messages": [], "completions": [{"text": "x", "reward": "high"}]}],
                tmp_path,
                "bad",
            )
        )
    assert caught.value.code == "data_schema_error"
    (tmp_path / "taken").mkdir()
    with pytest.raises(TrainingError) as caught:
        run(train_request(tiny_model_dir, fixed_groups(1), tmp_path, "taken"))
    assert caught.value.code == "adapter_already_exists"


def test_the_lean_and_transformers_forwards_train_alike(tiny_model_dir, tmp_path, one_thread, monkeypatch):
    """The lean forward is a speed path, not different maths: with it refused (as for a model it
    does not support) the run takes the transformers forward, says so, and its losses agree."""
    lean = run(train_request(tiny_model_dir, fixed_groups(3), tmp_path, "lean", kl_estimator="k3"))
    assert lean.receipt["runtime"]["execution_provenance"]["forward_path"] == "lean"

    from gpu_runtime import lean_decoder

    def refuse(model, **kwargs):
        raise lean_decoder.LeanUnsupported("refused by the test")

    monkeypatch.setattr(lean_decoder, "plan_for", refuse)
    hf = run(train_request(tiny_model_dir, fixed_groups(3), tmp_path, "hf", kl_estimator="k3"))
    provenance = hf.receipt["runtime"]["execution_provenance"]
    assert provenance["forward_path"] == "transformers" and provenance["reference_path"] == "shared_prefix"
    assert {"capability": "lean_forward", "fallback": "transformers_forward", "reason": "refused by the test"} in hf.receipt["fallbacks"]
    for a, b in zip(lean.receipt["loss_history"], hf.receipt["loss_history"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-4)
        assert a["kl_estimator_mean"] == pytest.approx(b["kl_estimator_mean"], abs=1e-5)
    assert lean.receipt["loss_history"][-1]["kl_estimator_mean"] > 0  # the steps moved the policy


def test_checkpoint_segments_are_honoured_without_changing_the_result(tiny_model_dir, tmp_path, one_thread):
    plain = run(train_request(tiny_model_dir, fixed_groups(2), tmp_path, "plain"))
    segmented = run(train_request(tiny_model_dir, fixed_groups(2), tmp_path, "seg", grad_checkpoint_segments=2))
    assert segmented.receipt["fallbacks"] == []  # the lean forward checkpoints in 2 segments as asked
    for a, b in zip(plain.receipt["loss_history"], segmented.receipt["loss_history"], strict=True):
        assert a["loss"] == pytest.approx(b["loss"], abs=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)


# The tiny model keeps 96 x 3 activations a token: 1 puts one completion in each part, 288 x 80 two.
@pytest.mark.parametrize("activations", [1, 288 * 80])
def test_a_step_in_micro_batches_trains_as_the_whole_step(tiny_model_dir, tmp_path, one_thread, monkeypatch,
                                                          activations):
    """On the CPU a large group's step runs its completions in micro-batches (so its activations stay
    small); with the budget cut to force that (one or two completions a part) the losses, KL
    figures, policy audit and trained weights are the whole step's."""
    from gpu_runtime.grpo import step

    whole = run(train_request(tiny_model_dir, fixed_groups(3), tmp_path / "whole", "a", kl_estimator="k3"))
    monkeypatch.setattr(step, "MICRO_BATCH_ACTIVATIONS", activations)
    parted = run(train_request(tiny_model_dir, fixed_groups(3), tmp_path / "parted", "a", kl_estimator="k3"))
    steps = len(whole.receipt["loss_history"])
    assert whole.receipt["runtime"]["execution_provenance"]["micro_batched_steps"] == 0
    assert parted.receipt["runtime"]["execution_provenance"]["micro_batched_steps"] == steps == 3
    for a, b in zip(whole.receipt["loss_history"], parted.receipt["loss_history"], strict=True):
        for key in ("loss", "policy_loss", "kl_loss", "kl_mean", "kl_estimator_mean", "ratio_mean", "grad_norm"):
            assert a[key] == pytest.approx(b[key], abs=1e-5, rel=1e-4), key
        assert a["action_tokens"] == b["action_tokens"]
    assert whole.receipt["grpo"]["policy_audit"]["importance_sampling"]["action_tokens"] == (
        parted.receipt["grpo"]["policy_audit"]["importance_sampling"]["action_tokens"]
    )
    trained = [load_file(str(r.adapter_path / "adapter_model.safetensors")) for r in (whole, parted)]
    assert trained[0].keys() == trained[1].keys()
    for name, value in trained[0].items():
        assert torch.allclose(value, trained[1][name], atol=1e-5), name


def test_the_reward_filter_sidecar_is_named_only_where_it_was_written(tiny_model_dir, tmp_path, one_thread):
    """reference-spec §2.9 data.reward_filter_sidecar. The review caught a first version that named the sidecar
    in failure receipts too, beside which it is never written (the zero_groups failure it would explain)."""
    groups = fixed_groups(2)
    result = run(train_request(tiny_model_dir, groups, tmp_path, "filtered", reward_filter_var_min=0.01))
    assert result.receipt["data"]["reward_filter_sidecar"] == "reward_filter_groups.json"
    sidecar = json.loads((tmp_path / "filtered" / "reward_filter_groups.json").read_text())
    assert sidecar["schema"] == "kiln.reward-filter-groups.v1" and len(sidecar["groups"]) == 2
    with pytest.raises(TrainingError) as caught:
        run(train_request(tiny_model_dir, groups, tmp_path, "emptied", reward_filter_var_min=100.0))
    assert caught.value.code == "zero_groups"
    failed = json.loads(open(caught.value.receipt_path).read())
    assert failed["status"] == "failed" and "reward_filter_sidecar" not in failed["data"]
    plain = run(train_request(tiny_model_dir, groups, tmp_path, "plain"))
    assert "reward_filter_sidecar" not in plain.receipt["data"]
    assert not (tmp_path / "plain" / "reward_filter_groups.json").exists()
