"""POST /v1/train/grpo admission: one source, validation with the offending field, pinned snapshot."""

import json
import os
import stat
from pathlib import Path

import pytest

from adapters.models import Adapter
from core.canonical import sha256_digest
from core.jobs.models import Job
from tests.training.conftest import GROUP

pytestmark = pytest.mark.django_db




def _post(api, body, route="/v1/train/grpo"):
    return api.post(route, data=json.dumps(body), content_type="application/json")


def _error(response, status, code="training_invalid_request"):
    assert response.status_code == status, response.content
    error = response.json()["error"]
    assert error["code"] == code
    return error["message"]


def test_inline_groups_are_queued_with_a_pinned_snapshot(api):
    response = _post(api, {"groups": [GROUP], "config": {"output_name": "math-r001", "seed": 7}})
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["state"] == "queued" and body["effective_seed"] == "7"
    job = Job.objects.get(uuid=body["job_id"])
    assert (job.kind, job.queue, job.payload["adapter_name"]) == ("training.grpo", "gpu", "math-r001")
    snapshot = job.payload["snapshot_path"]
    data = open(snapshot, "rb").read()
    assert json.loads(data.splitlines()[0]) == GROUP
    assert job.payload["training_data"]["admitted_corpus_sha256"] == sha256_digest(data)
    assert job.payload["training_data"] == {"source": "inline", "admitted_corpus_sha256": sha256_digest(data),
                                            "rows": 1, "rollouts": 2, "groups_with_reward_contrast": 1}
    assert not os.stat(snapshot).st_mode & (stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH)
    assert job.payload["config"]["behavior_policy"] == "no_importance_correction"
    assert Adapter.objects.get(name="math-r001").state == "writing"


def test_jobs_on_one_corpus_share_its_bytes_and_the_last_delete_frees_them(api):
    """QA: ten trainings on one 19 MB file kept ten byte-identical snapshots. Each job's pinned file is now
    a hard link to one copy named by the corpus digest; deleting the jobs (failed, cancelled) frees it."""
    import uuid

    from training.snapshots import snapshot_discard, snapshots_dir

    group = {**GROUP, "messages": [{"role": "user", "content": f"What is 2 + 3? ({uuid.uuid4().hex})"}]}
    jobs = []
    for name in ("share-r001", "share-r002", "share-r003"):
        response = _post(api, {"groups": [group], "config": {"output_name": name}})
        assert response.status_code == 200, response.content
        jobs.append(Job.objects.get(uuid=response.json()["job_id"]))
    pinned = [Path(job.payload["snapshot_path"]) for job in jobs]
    digest = jobs[0].payload["training_data"]["admitted_corpus_sha256"]
    shared = snapshots_dir() / f"sha256-{digest.removeprefix('sha256:')}.jsonl"
    assert len(set(pinned)) == 3 and {os.stat(p).st_ino for p in pinned} == {os.stat(shared).st_ino}
    assert os.stat(shared).st_nlink == 4 and sha256_digest(shared.read_bytes()) == digest
    other = _post(api, {"groups": [{**group, "completions": group["completions"][::-1]}],
                        "config": {"output_name": "share-r004"}}).json()
    assert os.stat(Job.objects.get(uuid=other["job_id"]).payload["snapshot_path"]).st_ino != os.stat(shared).st_ino
    for left, job in reversed(list(enumerate(jobs))):
        Job.objects.filter(id=job.id).update(state="failed")
        job.refresh_from_db()
        assert snapshot_discard(job)
        if left:
            assert os.stat(shared).st_nlink == left + 1
            assert not os.stat(shared).st_mode & stat.S_IWUSR  # still read-only for the jobs left
    assert not shared.exists() and not any(p.exists() for p in pinned)


def test_agentic_alias_and_rollouts_alias(api):
    group = {"messages": GROUP["messages"], "rollouts": GROUP["completions"]}
    response = _post(api, {"agentic_groups": [group], "config": {"output_name": "agent-1"}}, "/v1/train/agentic")
    assert response.status_code == 200, response.content
    assert Job.objects.get(uuid=response.json()["job_id"]).payload["route"] == "/v1/train/agentic"


def test_dataset_path_is_read_by_the_server_and_validated_in_full(api, tmp_path):
    path = tmp_path / "groups.jsonl"
    path.write_text(json.dumps(GROUP) + "\n\n" + json.dumps(GROUP) + "\n")
    response = _post(api, {"dataset_path": str(path), "config": {"output_name": "from-file"}})
    assert response.status_code == 200, response.content
    job = Job.objects.get(uuid=response.json()["job_id"])
    assert job.payload["training_data"]["rows"] == 2
    assert job.payload["training_data"]["source"] == "dataset_path"
    path.write_text(json.dumps(GROUP) + "\n" + '{"messages": [], "completions": []}\n')
    message = _error(_post(api, {"dataset_path": str(path), "config": {"output_name": "bad-file"}}), 400)
    assert "groups[1].messages (line 2)" in message  # 0-based JSON path, and the line
    path.write_text("")
    assert _error(_post(api, {"dataset_path": str(path)}), 400).startswith("dataset_path: the file holds no groups")
    assert "absolute" in _error(_post(api, {"dataset_path": "rel/groups.jsonl"}), 400)
    assert "not a readable file" in _error(_post(api, {"dataset_path": str(tmp_path / "nope.jsonl")}), 400)


@pytest.mark.parametrize("body, field", [
    ({"groups": [GROUP], "dataset_path": "/tmp/x.jsonl"}, "source"),
    ({}, "source"),
    ({"groups": [GROUP], "dataset_split": "test"}, "dataset_split"),
    ({"groups": [{**GROUP, "completions": [{"text": "5", "reward": float("nan")}]}]}, "groups[0].completions[0].reward"),
    ({"groups": [{**GROUP, "completions": [{"text": "5"}]}]}, "groups[0].completions[0].reward"),
    ({"groups": [{**GROUP, "completions": [{"reward": 1}]}]}, "groups[0].completions[0].text"),
    ({"groups": [GROUP], "config": {"behavior_policy": "recorded"}}, "config.behavior_policy"),
    ({"groups": [GROUP], "config": {"base_adapter": "never-trained"}}, "config.base_adapter"),
    ({"groups": [GROUP], "config": {"kl_coeff": 0.1, "kl_reference_policy": "none"}}, "kl_reference_policy"),
    ({"groups": [GROUP], "config": {"clip_epsilon": -1}}, "clip_epsilon"),
    ({"groups": [GROUP], "config": {"is_level": "banana"}}, "is_level"),
])
def test_invalid_requests_name_the_field_and_store_nothing(api, body, field):
    raw = json.dumps(body).replace("NaN", "NaN")
    response = api.post("/v1/train/grpo", data=raw, content_type="application/json")
    message = _error(response, 400)
    assert field in message
    assert Job.objects.count() == 0 and Adapter.objects.count() == 0


def test_named_dataset_is_a_clear_404_until_the_registry_exists(api):
    _error(_post(api, {"dataset": "math"}), 404, "dataset_not_found")


def test_output_name_conflicts(api):
    assert _post(api, {"groups": [GROUP], "config": {"output_name": "math-r001"}}).status_code == 200
    _error(_post(api, {"groups": [GROUP], "config": {"output_name": "math-r001"}}), 409, "adapter_revision_conflict")
    _error(_post(api, {"groups": [GROUP], "config": {"output_name": "../etc"}}), 400)
    assert Job.objects.count() == 1


def test_queue_cap_is_503_training_queue_full_with_retry_after(api, settings):
    from dataclasses import replace

    settings.KILN = replace(settings.KILN, max_queued_jobs=1)
    assert _post(api, {"groups": [GROUP], "config": {"output_name": "one"}}).status_code == 200
    response = _post(api, {"groups": [GROUP], "config": {"output_name": "two"}})
    _error(response, 503, "training_queue_full")
    assert response["Retry-After"] == "30"
    assert not Adapter.objects.filter(name="two").exists()


def _tracked(kind: str, count: int, *, ended_minutes_ago: float, deleted: bool = False) -> None:
    """`count` finished jobs of `kind` that ended that long ago (rows only: what the cap counts)."""
    from datetime import timedelta

    from django.utils import timezone

    ended = timezone.now() - timedelta(minutes=ended_minutes_ago)
    Job.objects.bulk_create([Job(kind=kind, queue="gpu", state="completed", finished_at=ended,
                                 deleted_at=ended if deleted else None) for _ in range(count)])


def test_tracked_cap_is_503_training_tracked_full_until_finished_jobs_age_out_or_are_deleted(api):
    from core.jobs.kinds import MAX_TRACKED_JOBS

    _tracked("training.grpo", MAX_TRACKED_JOBS - 1, ended_minutes_ago=59)
    _tracked("training.grpo", 5, ended_minutes_ago=61)  # aged out: no longer tracked
    _tracked("training.grpo", 5, ended_minutes_ago=1, deleted=True)  # deleted: no longer tracked
    _tracked("eval.run", 5, ended_minutes_ago=1)  # another kind's jobs count toward its own cap only
    assert _post(api, {"groups": [GROUP], "config": {"output_name": "last"}}).status_code == 200  # 1024th
    response = _post(api, {"groups": [GROUP], "config": {"output_name": "one-too-many"}})
    message = _error(response, 503, "training_tracked_full")
    assert response["Retry-After"] == "30" and f"{MAX_TRACKED_JOBS} training.grpo jobs are tracked" in message
    assert not Adapter.objects.filter(name="one-too-many").exists()  # the refusal reserved nothing
    Job.objects.filter(kind="training.grpo", state="completed").order_by("id").first().delete()
    assert _post(api, {"groups": [GROUP], "config": {"output_name": "one-too-many"}}).status_code == 200


def test_status_queue_detail_and_cancel_routes(api, django_capture_on_commit_callbacks):
    first = _post(api, {"groups": [GROUP], "config": {"output_name": "q1"}}).json()["job_id"]
    second = _post(api, {"groups": [GROUP], "config": {"output_name": "q2"}}).json()["job_id"]
    queue = api.get("/v1/train/queue").json()
    assert [(q["job_id"], q["position"], q["adapter_name"]) for q in queue["queued"]] == [
        (first, 1, "q1"), (second, 2, "q2")]
    assert queue["running"] is None
    detail = api.get(f"/v1/train/jobs/{first}").json()
    assert detail["state"] == "queued" and detail["adapter_name"] == "q1" and detail["train_receipt"] is None
    assert detail["training_data"]["rows"] == 1
    assert [s["job_id"] for s in api.get("/v1/train/status").json()] == [second, first]
    with django_capture_on_commit_callbacks(execute=True):
        assert api.delete(f"/v1/train/queue/{first}").json() == {"status": "cancelled", "job_id": first}
    assert not Adapter.objects.filter(name="q1").exists()  # the cancelled job's name is free again
    _error(api.delete(f"/v1/train/queue/{first}"), 409, "training_job_not_cancellable")
    _error(api.get("/v1/train/jobs/3f1f8c5e-0000-4000-8000-000000000000"), 404, "training_job_not_found")
    _error(api.delete(f"/v1/train/jobs/{second}"), 409, "training_job_already_started")
    assert api.delete(f"/v1/train/jobs/{first}").json()["status"] == "deleted"


def test_training_without_model_weights_is_refused_at_submission_with_mock_mode(api, settings):
    """The guide's "training says real weights are unavailable": with no model configured every
    submission route (and a dry run) answers 503 mock_mode before anything is stored."""
    import dataclasses

    settings.KILN = dataclasses.replace(settings.KILN, model_path=None)
    body = {"groups": [GROUP], "config": {"output_name": "no-weights"}}
    for route in ("/v1/train/grpo", "/v1/train/agentic", "/v1/training/grpo"):
        message = _error(_post(api, body, route), 503, "mock_mode")
        assert "real model weights are unavailable" in message
    _error(_post(api, dict(body, dry_run=True)), 503, "mock_mode")
    assert "KILN_MODEL_PATH" in _post(api, body).json()["error"]["hint"]
    assert not Job.objects.exists() and not Adapter.objects.filter(name="no-weights").exists()


def test_a_queued_job_that_meets_a_worker_without_model_weights_fails_with_mock_mode(
    api, settings, django_capture_on_commit_callbacks
):
    """The web process had a model when it admitted the job; the worker that picks it up has none
    (started with other settings): the job fails with a clear code and its adapter name is released."""
    import dataclasses

    from core.jobs.runner import run_queued_jobs

    job_id = _post(api, {"groups": [GROUP], "config": {"output_name": "no-weights"}}).json()["job_id"]
    assert Adapter.objects.get(name="no-weights").state == "writing"  # reserved while queued
    settings.KILN = dataclasses.replace(settings.KILN, model_path=None)
    with django_capture_on_commit_callbacks(execute=True):  # the failure hook runs after commit
        run_queued_jobs("gpu")
    detail = api.get(f"/v1/train/jobs/{job_id}").json()
    assert detail["state"] == "failed"
    assert detail["error"]["code"] == "mock_mode"
    assert "real model weights are unavailable" in detail["error"]["message"]
    assert "KILN_MODEL_PATH for the workers" in detail["error"]["hint"]
    assert detail["adapter_path"] is None
    assert not Adapter.objects.filter(name="no-weights").exists()  # released: the name is free again


def test_a_failed_jobs_detail_shows_its_failure_receipt(api, settings):
    # A job that failed or was cancelled after admission leaves its receipt under training/receipts/
    # (no adapter was published); the job detail used to answer train_receipt null.
    from core.jobs.services import job_fail

    job_id = _post(api, {"groups": [GROUP], "config": {"output_name": "f1"}}).json()["job_id"]
    job = Job.objects.get(uuid=job_id)
    path = settings.KILN.layout.failure_receipt(job_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    receipt = {"schema": "kiln.train-receipt.v1", "status": "failed", "failure_reason": "cancelled", "job_id": job_id}
    path.write_text(json.dumps(receipt))
    assert api.get(f"/v1/train/jobs/{job_id}").json()["train_receipt"] is None  # queued: not its receipt yet
    Job.objects.filter(id=job.id).update(state="running")  # claimed by the GPU worker, then it fails
    job.refresh_from_db()
    assert job_fail(job=job, code="cancelled", message="cancelled after 51 optimizer steps")
    detail = api.get(f"/v1/train/jobs/{job_id}").json()
    assert detail["state"] == "failed" and detail["train_receipt"] == receipt


def test_a_cancelled_training_job_reads_failed_on_the_training_routes(api, django_capture_on_commit_callbacks):
    # Reference-spec §5: queued → running → completed | failed, cancellation ends failed with an error.
    # The guide's step-6 loop waits for completed or failed; a cancelled job used to loop it for ever.
    job_id = _post(api, {"groups": [GROUP], "config": {"output_name": "c1"}}).json()["job_id"]
    with django_capture_on_commit_callbacks(execute=True):
        assert api.delete(f"/v1/train/queue/{job_id}").json() == {"status": "cancelled", "job_id": job_id}
    assert Job.objects.get(uuid=job_id).state == "cancelled"  # the generic job keeps its own state
    for route in (f"/v1/train/jobs/{job_id}", f"/v1/train/status/{job_id}"):
        body = api.get(route).json()
        assert body["state"] == "failed" and body["error"]["code"] == "job_cancelled", (route, body)
    [listed] = [s for s in api.get("/v1/train/status").json() if s["job_id"] == job_id]
    assert listed["state"] == "failed"
    assert api.get(f"/v1/jobs/{job_id}").json()["state"] == "cancelled"


def test_the_detail_carries_a_replay_request_that_trains_the_same_data_again(api, tmp_path):
    path = tmp_path / "groups.jsonl"
    path.write_text(json.dumps(GROUP) + "\n")
    first = _post(api, {"dataset_path": str(path), "config": {"output_name": "again-r001", "seed": 3}}).json()
    detail = api.get(f"/v1/train/jobs/{first['job_id']}").json()
    job = Job.objects.get(uuid=first["job_id"])
    replay = detail["replay_request"]
    assert replay == {"route": "/v1/train/grpo", "body": {"dataset_path": str(path), "config": job.payload["config"]}}
    assert detail["checkpoint_error"] is None and detail["metadata_error"] is None
    body = {**replay["body"], "config": {**replay["body"]["config"], "output_name": "again-r002"}}
    second = Job.objects.get(uuid=_post(api, body, replay["route"]).json()["job_id"])
    assert {**second.payload["config"], "output_name": "again-r001"} == job.payload["config"]
    assert second.payload["training_data"]["admitted_corpus_sha256"] == \
        job.payload["training_data"]["admitted_corpus_sha256"]
    inline = _post(api, {"groups": [GROUP], "config": {"output_name": "inline-r001"}}).json()
    assert api.get(f"/v1/train/jobs/{inline['job_id']}").json()["replay_request"] is None


def test_a_failed_checkpoint_and_a_resumes_history_reach_the_job_detail(api):
    from training.runner import ProgressRecorder

    response = _post(api, {"groups": [GROUP], "config": {"output_name": "ck-r001"}}).json()
    job = Job.objects.get(uuid=response["job_id"])

    class Context:
        def report_progress(self, progress, message, metrics):
            Job.objects.filter(id=job.id).update(metrics=metrics)

    recorder = ProgressRecorder(Context())
    restored = [{"step": s, "loss": 0.5 / s, "epoch": 0, "progress": s / 4, "kl_mean": 0.01 * s,
                 "elapsed_secs": float(s)} for s in (1, 2)]
    recorder({"restored_loss_history": restored})
    recorder({"step": 3, "total_steps": 4, "progress": 0.75, "loss": 0.1, "reward_mean": 0.5, "kl_mean": 0.03})
    recorder({"checkpoint_error": "checkpoint ck-r001-checkpoint-step-00000003 already exists"})
    detail = api.get(f"/v1/train/jobs/{job.uuid}").json()
    assert [p["step"] for p in detail["loss_history"]] == [1, 2, 3]
    assert [p["kl_mean"] for p in detail["kl_history"]] == [0.01, 0.02, 0.03]
    assert detail["checkpoint_error"] == "checkpoint ck-r001-checkpoint-step-00000003 already exists"
    long = [{"step": s, "loss": 0.1, "progress": s / 1200} for s in range(1, 1201)]  # a long run resumed
    recorder({"restored_loss_history": long})
    assert len(recorder.metrics["loss_history"]) <= 500 and recorder.metrics["loss_history"][-1]["step"] == 1200


def test_a_warm_start_with_another_lora_shape_is_refused_before_it_queues(api, tmp_path):
    """The trainer refused it (`shape_mismatch`) only once the job ran; admission reads the base
    adapter's adapter_config.json and refuses the request before anything is queued."""
    from django.utils import timezone

    from adapters.models import AdapterState

    folder = tmp_path / "r16"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 16, "lora_alpha": 32.0}))
    Adapter.objects.create(name="r16", state=AdapterState.PUBLISHED, path=str(folder), content_sha256="sha256:" + "0" * 64,
                           published_at=timezone.now())
    response = _post(api, {"groups": [GROUP], "config": {"output_name": "r8", "base_adapter": "r16", "lora_rank": 8,
                                                         "lora_alpha": 16}})
    message = _error(response, 400)
    assert message.startswith("config.lora_rank: a warm start keeps the base adapter's LoRA shape: lora_rank 8 != "
                              "the base adapter's 16; lora_alpha 16 != the base adapter's 32")
    assert response.json()["error"]["hint"].startswith("train with lora_rank 16, lora_alpha 32")
    assert Job.objects.count() == 0
    ok = _post(api, {"groups": [GROUP], "config": {"output_name": "r16-next", "base_adapter": "r16"}})
    assert ok.status_code == 200, ok.content  # the default shape matches


def test_a_base_adapter_gone_before_the_job_starts_fails_it_with_base_adapter_missing(
    api, settings, tmp_path, django_capture_on_commit_callbacks
):
    """The delete route refuses the base of a queued round (adapter_in_use); a base removed anyway
    (by hand, in the registry's database) fails the round at its start with the receipt's reason."""
    import dataclasses

    from django.utils import timezone

    from adapters.models import AdapterState
    from core.jobs.runner import run_queued_jobs

    folder = tmp_path / "r001"
    folder.mkdir()
    (folder / "adapter_config.json").write_text(json.dumps({"r": 16, "lora_alpha": 32.0}))
    Adapter.objects.create(name="r001", state=AdapterState.PUBLISHED, path=str(folder),
                           content_sha256="sha256:" + "0" * 64, published_at=timezone.now())
    submitted = _post(api, {"groups": [GROUP], "config": {"output_name": "r002", "base_adapter": "r001"}})
    assert submitted.status_code == 200, submitted.content
    job_id = submitted.json()["job_id"]
    assert api.delete("/v1/adapters/r001").json()["error"]["code"] == "adapter_in_use"
    Adapter.objects.filter(name="r001").delete()
    settings.KILN = dataclasses.replace(settings.KILN, model_path=tmp_path / "model")  # never reached
    with django_capture_on_commit_callbacks(execute=True):
        run_queued_jobs("gpu")
    error = api.get(f"/v1/train/jobs/{job_id}").json()["error"]
    assert error["code"] == "base_adapter_missing" and "'r001' is no longer published" in error["message"]
    assert not Adapter.objects.filter(name="r002").exists()  # its reservation was released


def test_a_dry_run_plans_and_queues_nothing(api, tmp_path):
    """`dry_run: true` used to be carried in the payload and ignored: the job trained and published."""
    flat = {"messages": [{"role": "user", "content": "What is 1 + 1?"}],
            "completions": [{"text": "2", "reward": 1.0}, {"text": "2", "reward": 1.0}]}
    body = {"groups": [GROUP, flat], "config": {"output_name": "dry-r001", "seed": 7, "typo_key": 1}, "dry_run": True}
    response = _post(api, body)
    assert response.status_code == 200, response.content
    plan = response.json()
    assert plan["mode"] == "jsonl_grpo_groups_dry_run" and plan["dry_run"] is True
    assert plan["would_publish"] == "dry-r001" and plan["effective_seed"] == "7"
    assert plan["effective_config"]["output_name"] == "dry-r001" and plan["ignored_config_keys"] == ["typo_key"]
    assert plan["training_data"]["rows"] == 2 and plan["training_data"]["rollouts"] == 4
    assert (plan["groups_with_reward_contrast"], plan["groups_without_reward_contrast"]) == (1, 1)
    assert "job_id" not in plan
    assert Job.objects.count() == 0 and Adapter.objects.count() == 0
    # a dry run is admitted like a real request: bad input is refused the same way
    _error(_post(api, {**body, "config": {"lora_rank": 0}}), 400)
    # and the real request afterwards queues
    queued = _post(api, {**body, "dry_run": False})
    assert queued.status_code == 200 and "job_id" in queued.json()
    _error(_post(api, body), 409, "adapter_revision_conflict")  # the name is taken now


@pytest.mark.parametrize("name", [5, ["mathds"], "", "   ", {"name": "x"}])
def test_a_dataset_that_is_not_a_name_is_400_not_a_missing_dataset(api, name):
    message = _error(_post(api, {"dataset": name, "config": {"output_name": "ds-r001"}}), 400)
    assert message.startswith("dataset: must be a dataset's name")
    assert not Job.objects.exists() and not Adapter.objects.filter(name="ds-r001").exists()


def test_the_openapi_post_eval_schema_refuses_unknown_keys_as_the_server_does(api):
    found = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("title") == "PostEvalConfig":
                found.append(node)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(api.get("/v1/openapi.json").json())
    assert found and all(node["additionalProperties"] is False for node in found)
    message = _error(_post(api, {"groups": [GROUP], "config": {"output_name": "pe-r001"},
                                 "post_eval": {"suite": "s", "min_accurasy": 0.5}}), 400)
    assert "min_accurasy" in message
    assert not Job.objects.exists()


def test_an_output_name_held_by_an_unregistered_folder_is_refused_before_training(api, settings):
    """A demoted `<name>.failed` is no registered adapter but holds its folder: a run naming it was
    queued, trained, and failed only at publication (adapter_already_exists)."""
    folder = settings.KILN.layout.adapters / "g2.failed"
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"old")
    body = {"groups": [GROUP], "config": {"output_name": "g2.failed"}}
    for request in ({**body, "dry_run": True}, body):
        message = _error(_post(api, request), 409, "adapter_revision_conflict")
        assert "the adapters folder already holds g2.failed" in message
    assert not Job.objects.exists() and not Adapter.objects.filter(name="g2.failed").exists()
    assert (folder / "adapter_model.safetensors").read_bytes() == b"old"


def test_a_corpus_without_reward_contrast_is_queued_with_a_warning(api):
    """The guide's single task (47 + 138) on the demo model: every reward 0, so dynamic sampling drops
    every group and the job can only fail zero_groups; the answer says so at once (QA)."""
    flat = {**GROUP, "completions": [{**c, "reward": 0.0} for c in GROUP["completions"]]}
    dry = _post(api, {"groups": [flat], "dry_run": True, "config": {"output_name": "flat-r001"}}).json()
    assert dry["groups_with_reward_contrast"] == 0
    [warning] = dry["warnings"]
    assert "no group's rewards differ (all 1 group(s)" in warning and "zero_groups" in warning
    queued = _post(api, {"groups": [flat], "config": {"output_name": "flat-r001"}})
    assert queued.status_code == 200, queued.content
    assert queued.json()["warnings"] == [warning]
    assert Job.objects.get(uuid=queued.json()["job_id"]).payload["training_data"]["groups_with_reward_contrast"] == 0
    kept = _post(api, {"groups": [flat], "config": {"output_name": "flat-r002", "dynamic_sampling": False}}).json()
    assert "every advantage is zero" in kept["warnings"][0]
    contrasted = _post(api, {"groups": [GROUP], "config": {"output_name": "math-r009"}}).json()
    assert contrasted["warnings"] == []


def test_a_full_disk_at_submission_is_507_and_leaves_nothing(api, monkeypatch):
    """QA: with KILN_HOME on a full tmpfs, POST /v1/train/grpo answered 500 internal_error (ENOSPC while
    pinning the snapshot); /v1/eval/run likewise: tests/evaluations/test_eval_jobs_api.py."""
    import errno

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr("training.snapshots.write_file", full)
    # a corpus no earlier job pinned (one already pinned is linked, which needs no new bytes)
    fresh = {**GROUP, "messages": [{"role": "user", "content": "What is 2 + 3, on a full disk?"}]}
    response = _post(api, {"groups": [fresh], "config": {"output_name": "math-r001"}})
    assert response.status_code == 507, response.content
    error = response.json()["error"]
    assert error["code"] == "adapter_disk_quota_exceeded" and "disk is full" in error["message"] and error["hint"]
    assert not Job.objects.exists() and not Adapter.objects.filter(name="math-r001").exists()

