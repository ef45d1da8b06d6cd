"""/v1/train/* are typed: the OpenAPI document describes the request and answers, the contract stays
the one checker (stable codes), and deleting a finished job keeps its row and events."""

import json
from pathlib import Path

import pytest
from django.test import Client

from core.accounts.services import token_create, user_create
from core.jobs.models import Job, JobEvent, JobState
from tests.training.conftest import GROUP

pytestmark = pytest.mark.django_db




def _post(api, body):
    return api.post("/v1/train/grpo", data=body if isinstance(body, str) else json.dumps(body),
                    content_type="application/json")


def test_openapi_has_a_request_body_for_every_post_and_put_and_describes_the_grpo_request(api):
    doc = api.get("/v1/openapi.json").json()
    writes = [(path, method, op) for path, ops in doc["paths"].items() for method, op in ops.items()
              if method in ("post", "put", "patch")]
    assert writes and all("requestBody" in op for _, _, op in writes), [
        (path, method) for path, method, op in writes if "requestBody" not in op]
    schemas = doc["components"]["schemas"]
    request = schemas["GrpoRequest"]["properties"]
    config = request["config"]
    assert config["title"] == "GrpoConfig"
    assert config["properties"]["lora_rank"] == {"type": "integer", "default": 16, "minimum": 1, "maximum": 1024}
    assert config["properties"]["checkpoint_interval"]["anyOf"][0]["maximum"] == 1_000_000
    assert config["properties"]["kl_reference_policy"]["properties"]["refresh_every"]["maximum"] == 1_000_000
    assert config["properties"]["behavior_policy"]["enum"] == ["no_importance_correction", "recorded"]
    assert config["properties"]["optimizer"]["properties"]["kind"]["enum"] == ["muon", "adam_w", "sgd"]
    assert config["properties"]["loss"]["properties"]["echo"]["anyOf"][0]["properties"]["lambda"]["type"] == "number"
    post_eval = request["post_eval"]["anyOf"][0]
    assert post_eval["title"] == "PostEvalConfig" and post_eval["properties"]["data_scope"]["enum"] == [
        "held-out", "train-set-eval"]
    # QA: the group's rollout listed `segments` / `rollout_provenance`, names the contract ignores (a client
    # generated from the document lost its provenance); they are the names core.contracts.groups reads
    group = request["groups"]["items"]
    for alias in ("completions", "rollouts"):
        rollout = group["properties"][alias]["items"]
        assert set(rollout["properties"]) == {"text", "reward", "trajectory", "provenance", "openenv"}
        assert rollout["required"] == ["text", "reward"]
    grpo = doc["paths"]["/v1/train/grpo"]["post"]
    assert grpo["requestBody"]["content"]["application/json"]["schema"]["$ref"].endswith("/GrpoRequest")
    answers = grpo["responses"]["200"]["content"]["application/json"]["schema"]["anyOf"]  # queued, or a dry run's plan
    assert [a["$ref"].rsplit("/", 1)[1] for a in answers] == ["GrpoQueued", "GrpoDryRun"]
    detail = doc["paths"]["/v1/train/jobs/{job_id}"]["get"]["responses"]["200"]
    assert detail["content"]["application/json"]["schema"]["$ref"].endswith("/TrainingDetail")


def test_unknown_fields_are_ignored_and_bad_values_keep_their_stable_codes(api):
    accepted = _post(api, {"groups": [GROUP], "future_field": {"x": 1},
                           "config": {"output_name": "typed-r001", "not_a_knob": 3}})
    assert accepted.status_code == 200, accepted.content
    job = Job.objects.get(uuid=accepted.json()["job_id"])
    assert job.payload["ignored_config_keys"] == ["not_a_knob"]
    for body, needle in [("[1, 2]", "request"), ("not json", "request"),
                         ({"groups": [GROUP], "config": {"lora_rank": "16"}}, "config.lora_rank"),
                         ({"groups": [GROUP], "config": "abc"}, "config")]:
        response = _post(api, body)
        assert response.status_code == 400, (body, response.content)
        error = response.json()["error"]
        assert error["code"] == "training_invalid_request" and error["message"].startswith(needle), error


def test_deleting_a_finished_job_keeps_its_row_and_events(api):
    job_id = _post(api, {"groups": [GROUP], "config": {"output_name": "typed-r002"}}).json()["job_id"]
    refused = api.delete(f"/v1/train/jobs/{job_id}").json()["error"]
    assert refused["code"] == "training_job_already_started"
    assert f"DELETE /v1/train/queue/{job_id}" in refused["hint"]  # QA: the hint was the generic "read again"
    Job.objects.filter(uuid=job_id).update(state=JobState.FAILED)
    detail = api.get(f"/v1/train/jobs/{job_id}").json()
    assert detail["state"] == "failed"
    assert {"started_at", "epoch", "effective_config", "training_data", "train_receipt"} <= set(detail)
    snapshot = Path(Job.objects.get(uuid=job_id).payload["snapshot_path"])
    assert snapshot.is_file()
    # the failed job published nothing: its pinned corpus goes with it (it kept one per submission)
    assert api.delete(f"/v1/train/jobs/{job_id}").json() == {
        "job_id": job_id, "status": "deleted", "removed_archive_file": True}
    assert not snapshot.exists()
    assert api.get(f"/v1/train/jobs/{job_id}").json()["error"]["code"] == "training_job_not_found"
    assert job_id not in [s["job_id"] for s in api.get("/v1/train/status").json()]
    assert job_id not in [j["id"] for j in api.get("/v1/jobs").json()]
    row = Job.objects.get(uuid=job_id)  # kept for audit
    assert row.deleted_at is not None
    events = list(JobEvent.objects.filter(job=row).values_list("type", "message"))
    assert events[0][0] == "queued" and events[-1] == ("deleted", "deleted by trainer")
    assert api.delete(f"/v1/train/jobs/{job_id}").status_code == 404


def test_deleting_another_users_job_needs_its_own_permission(api):
    from django.contrib.auth.models import Permission


    job_id = _post(api, {"groups": [GROUP], "config": {"output_name": "theirs-r001"}}).json()["job_id"]
    Job.objects.filter(uuid=job_id).update(state=JobState.COMPLETED)
    other = user_create(username="other", password="long-enough-pw")
    other.user_permissions.add(Permission.objects.get(codename="submit_job"))
    other_api = Client(headers={"Authorization": f"Bearer {token_create(username='other')[1]}"})
    refused = other_api.delete(f"/v1/train/jobs/{job_id}")
    assert refused.status_code == 403 and refused.json()["error"]["code"] == "job_delete_forbidden"
    assert Job.objects.get(uuid=job_id).deleted_at is None
    other.user_permissions.add(Permission.objects.get(codename="delete_others_jobs"))
    other_api = Client(headers={"Authorization": f"Bearer {token_create(username='other')[1]}"})
    assert other_api.delete(f"/v1/train/jobs/{job_id}").json()["status"] == "deleted"


def test_a_resume_without_a_seed_inherits_the_checkpoints_effective_seed(api, settings):
    checkpoint = settings.KILN.layout.adapters / "math-r001-checkpoint-step-00000002.kiln-checkpoint"
    checkpoint.mkdir(parents=True)
    (checkpoint / "checkpoint_manifest.json").write_text(json.dumps({"effective_config": {"seed": "987654321"}}))
    resumed = _post(api, {"groups": [GROUP], "config": {"output_name": "math-r001b",
                                                         "resume_checkpoint": checkpoint.name}})
    assert resumed.status_code == 200, resumed.content
    assert resumed.json()["effective_seed"] == "987654321"
    explicit = _post(api, {"groups": [GROUP], "config": {"output_name": "math-r001c", "seed": 5,
                                                          "resume_checkpoint": checkpoint.name}})
    assert explicit.json()["effective_seed"] == "5"  # a seed the request sets still wins
    # what the worker would refuse at dequeue is refused at submission: nothing is queued
    queued = Job.objects.count()
    for value in ("nope.kiln-checkpoint", "/etc", str(settings.KILN.layout.adapters / "absent.kiln-checkpoint")):
        refused = _post(api, {"groups": [GROUP], "config": {"output_name": "math-r001d", "resume_checkpoint": value}})
        assert refused.status_code == 400, refused.content
        error = refused.json()["error"]
        assert error["code"] == "checkpoint_not_found" and error["message"].startswith("config.resume_checkpoint: ")
        assert "registry" in error["message"] and error["hint"]
    (checkpoint / "checkpoint_manifest.json").write_text(json.dumps({"adapter_name": "math-r001",
                                                                     "effective_config": {"seed": "1"}}))
    other = _post(api, {"groups": [GROUP], "config": {"output_name": "other-r001", "resume_checkpoint": checkpoint.name}})
    assert other.status_code == 409 and other.json()["error"]["code"] == "checkpoint_adapter_mismatch"
    assert "set output_name 'math-r001'" in other.json()["error"]["hint"]
    assert Job.objects.count() == queued


def test_auto_load_in_a_team_is_accepted_and_decided_by_the_promotion_rule(api):
    """auto_load activates nothing by itself any more: after training it queues the serving canary
    and activation, or, with [promotion] require_approval (on in a team), proposes a promotion that a
    reviewer decides (training.runner._auto_load; the seed loop in tests/integration proves it)."""
    from core.accounts.services import user_create

    alone = _post(api, {"groups": [GROUP], "config": {"output_name": "solo-r001"}})  # auto_load defaults to true
    assert alone.status_code == 200, alone.content
    user_create(username="reviewer", password="long-enough-pw")
    team = _post(api, {"groups": [GROUP], "config": {"output_name": "team-r001"}})
    assert team.status_code == 200, team.content
    assert Job.objects.filter(payload__adapter_name="team-r001", payload__config__auto_load=True).exists()


def test_a_completed_jobs_snapshot_stays_when_the_job_is_deleted(api):
    # its adapter's lineage check (kiln adapters verify, promotion evidence) re-hashes it
    job_id = _post(api, {"groups": [GROUP], "config": {"output_name": "typed-r003"}}).json()["job_id"]
    Job.objects.filter(uuid=job_id).update(state=JobState.COMPLETED)
    snapshot = Path(Job.objects.get(uuid=job_id).payload["snapshot_path"])
    assert api.delete(f"/v1/train/jobs/{job_id}").json()["removed_archive_file"] is False
    assert snapshot.is_file()
