"""The training memory preflight: 413 training_will_not_fit at submission for a step that cannot fit
the budget ([training] memory_budget_mib, or the live GPU worker's accelerator memory), nothing stored."""

import dataclasses
import json
import shutil
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from adapters.models import Adapter
from core.jobs.models import Job, WorkerHeartbeat
from training.snapshots import snapshots_dir

pytestmark = pytest.mark.django_db

ASSETS = Path(__file__).resolve().parents[2] / "gpu_runtime" / "assets" / "kiln-tiny"
# A Qwen3-4B-like shape (no weights are read: admission looks at config.json and tokenizer.json only).
QWEN3_4B = {"model_type": "qwen3", "hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36,
            "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936}
LONG = "the quick brown fox jumps over the lazy dog " * 40  # 1,760 characters


def _group(completions: int = 8, text: str = LONG) -> dict:
    return {"messages": [{"role": "user", "content": "Tell me a long story about a fox."}],
            "completions": [{"text": f"{i} {text}", "reward": float(i % 2)} for i in range(completions)]}


@pytest.fixture
def model_4b(settings, tmp_path):
    model = tmp_path / "qwen3-4b-like"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(QWEN3_4B))
    shutil.copy(ASSETS / "tokenizer.json", model / "tokenizer.json")
    settings.KILN = dataclasses.replace(settings.KILN, model_path=model)
    return model


def _budget(settings, mib: int) -> None:
    settings.KILN = dataclasses.replace(settings.KILN, training_memory_budget_mib=mib)


def _post(api, body):
    return api.post("/v1/train/grpo", data=json.dumps(body), content_type="application/json")


def _snapshots() -> set[Path]:
    return set(snapshots_dir().glob("*")) if snapshots_dir().exists() else set()


def _stored_nothing(name: str, snapshots_before: set[Path]) -> bool:
    return (not Job.objects.exists() and not Adapter.objects.filter(name=name).exists()
            and _snapshots() == snapshots_before)


def _gpu_worker(*, available_mib: float, seen_seconds_ago: float = 0, backend: str = "torch") -> None:
    now = timezone.now()
    WorkerHeartbeat.objects.create(
        worker_id="gpu-host:4242:abcd", hostname="gpu-host-elsewhere", pid=4242, queues=["gpu", "infer"],
        status={"model": {"loaded": True, "device": "cuda:0", "kernels": {"backend": backend}},
                "memory": {"device": "cuda:0", "total_mib": 81559.0, "free_mib": available_mib,
                           "resident_model_mib": 8000.0, "available_for_training_mib": available_mib}},
        started_at=now - timedelta(minutes=5), last_seen=now - timedelta(seconds=seen_seconds_ago))


def test_a_step_over_the_configured_budget_is_413_and_stores_nothing(api, settings, model_4b):
    _budget(settings, 2048)
    snapshots = _snapshots()
    response = _post(api, {"groups": [_group()], "config": {"output_name": "fox-r001"}})
    assert response.status_code == 413, response.content
    error = response.json()["error"]
    assert error["code"] == "training_will_not_fit"
    assert "allows 2048 MiB" in error["message"] and "[training] memory_budget_mib" in error["message"]
    assert "group 0" in error["message"] and "8 completions" in error["message"]
    needed = float(error["message"].split("needs at least ")[1].split(" MiB")[0])
    assert needed > 2048
    assert "grad_checkpoint_segments" in error["hint"]
    assert _stored_nothing("fox-r001", snapshots)


def test_the_same_request_under_a_budget_it_fits_is_queued(api, settings, model_4b):
    _budget(settings, 1_000_000)
    response = _post(api, {"groups": [_group()], "config": {"output_name": "fox-r001"}})
    assert response.status_code == 200, response.content
    assert Job.objects.count() == 1


def test_checkpointing_brings_a_step_under_the_budget(api, settings, model_4b):
    """The hint's first knob works: the same group with grad_checkpoint_segments fits a budget the
    plain step does not (the 4B-like shape's activations dominate at these lengths)."""
    body = {"groups": [_group()], "config": {"output_name": "fox-r001"}, "dry_run": True}
    plain = _post(api, body).json()["memory"]["largest_step"]["total_mib"]
    checkpointed_body = {**body, "config": {**body["config"], "grad_checkpoint_segments": 6}}
    checkpointed = _post(api, checkpointed_body).json()["memory"]["largest_step"]["total_mib"]
    assert checkpointed < plain / 2
    _budget(settings, int((plain + checkpointed) / 2))
    assert _post(api, {**body, "dry_run": False}).status_code == 413
    response = _post(api, {**checkpointed_body, "dry_run": False})
    assert response.status_code == 200, response.content


def test_without_a_budget_a_cpu_server_does_not_refuse(api, model_4b):
    response = _post(api, {"groups": [_group()], "config": {"output_name": "fox-r001"}})
    assert response.status_code == 200, response.content


def test_the_live_gpu_workers_free_memory_is_the_budget(api, model_4b):
    _gpu_worker(available_mib=1500.0)
    snapshots = _snapshots()
    response = _post(api, {"groups": [_group()], "config": {"output_name": "fox-r001"}})
    assert response.status_code == 413, response.content
    message = response.json()["error"]["message"]
    assert "the GPU worker's cuda:0" in message and "allows 1500 MiB" in message
    assert _stored_nothing("fox-r001", snapshots)


def test_a_gpu_worker_with_room_or_a_stale_one_does_not_refuse(api, model_4b):
    _gpu_worker(available_mib=500_000.0)
    assert _post(api, {"groups": [_group()], "config": {"output_name": "fox-r001"}}).status_code == 200
    WorkerHeartbeat.objects.all().delete()
    _gpu_worker(available_mib=10.0, seen_seconds_ago=3600)  # gone an hour: it says nothing now
    assert _post(api, {"groups": [_group()], "config": {"output_name": "fox-r002"}}).status_code == 200


def test_the_fused_head_keeps_no_logits(api, model_4b):
    """A GPU worker on Triton kernels keeps no [tokens x vocabulary] logits: the estimate drops them."""
    _gpu_worker(available_mib=1e6, backend="triton")
    plan = _post(api, {"groups": [_group()], "config": {"output_name": "fox-r001"}, "dry_run": True}).json()
    assert plan["memory"]["largest_step"]["logits_mib"] == 0 and plan["memory"]["device"] == "cuda"
    WorkerHeartbeat.objects.all().update(status={"model": {"device": "cuda:0", "kernels": {"backend": "torch"}},
                                                 "memory": {"available_for_training_mib": 1e6}})
    plan = _post(api, {"groups": [_group()], "config": {"output_name": "fox-r001"}, "dry_run": True}).json()
    assert plan["memory"]["largest_step"]["logits_mib"] > 1000  # 8 x ~400 tokens x 151,936 x 4 bytes x 2


def test_a_dry_run_shows_the_largest_step_and_the_budget(api, settings, model_4b):
    small = {"messages": [{"role": "user", "content": "Hi"}], "completions": [{"text": "a", "reward": 1.0},
                                                                             {"text": "b", "reward": 0.0}]}
    body = {"groups": [small, _group(4), small], "config": {"output_name": "fox-r001"}, "dry_run": True}
    plan = _post(api, body).json()
    memory = plan["memory"]
    assert memory["budget_mib"] is None and memory["fits"] is None and memory["token_counts"] == "tokenizer"
    largest = memory["largest_step"]
    assert largest["group"] == 1 and largest["completions"] == 4
    assert 300 < largest["longest_completion_tokens"] < 1800  # counted by the tokenizer, not in bytes
    assert largest["total_mib"] == pytest.approx(
        largest["adapter_and_optimizer_mib"] + largest["activations_mib"] + largest["logits_mib"], abs=0.2)
    _budget(settings, 1)
    refused = _post(api, body)
    assert refused.status_code == 413 and refused.json()["error"]["code"] == "training_will_not_fit"
    _budget(settings, 1_000_000)
    assert _post(api, body).json()["memory"]["fits"] is True
    assert not Job.objects.exists()


def test_provenance_token_counts_are_used_as_they_are(api, model_4b):
    """A rollout that carries its token ids is counted exactly: 3,000 completion tokens from a
    one-word text."""
    group = {"messages": [{"role": "user", "content": "Go"}],
             "completions": [{"text": "ok", "reward": r,
                              "provenance": {"input_token_ids": [5] * 3010, "prompt_token_count": 10}}
                             for r in (0.0, 1.0)]}
    response = _post(api, {"groups": [group], "config": {"output_name": "p-r001"}, "dry_run": True})
    assert response.status_code == 200, response.content
    largest = response.json()["memory"]["largest_step"]
    assert largest["longest_completion_tokens"] == 3000 and largest["prompt_tokens"] >= 10


def test_a_model_without_a_readable_config_is_not_estimated(api, settings, tmp_path):
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    settings.KILN = dataclasses.replace(settings.KILN, model_path=broken, training_memory_budget_mib=1)
    response = _post(api, {"groups": [_group()], "config": {"output_name": "fox-r001"}, "dry_run": True})
    assert response.status_code == 200 and response.json()["memory"] is None
