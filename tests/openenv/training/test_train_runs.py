"""`kind: train` runs against a real openenv==0.10.0 server (its own venv), in-process jobs, with the
scripted fake policy collecting and the real GRPO trainer on the tiny model (lora rank 2, two trained
groups). Covers the states to `completed`, the training job's config equal to the contract's, the
adapter published with its train receipt, the run's artifacts, the selection warnings (a
no-output completion dropped, an all-equal group skipped), nothing left → completed without a
training job, cancellation of the training (queued and running), the behavior adapter or served model
changing under the run (fail closed), and restoration with a running training job."""

from __future__ import annotations

import hashlib
import json
import os
import socket
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import pytest
from django.utils import timezone

from adapters.models import Adapter
from core.canonical import json_digest
from core.jobs import services as job_services
from core.jobs.models import Job, WorkerHeartbeat
from core.jobs.runner import run_queued_jobs
from openenv.models import OpenEnvRun
from openenv.runs.services import runs_restore
from openenv.verify import verify
from tests.openenv.runs.conftest import metric
from tests.openenv.training.conftest import error_of, heartbeat, post_run, publish_adapter, train_body

pytestmark = [pytest.mark.integration, pytest.mark.django_db, pytest.mark.timeout(600)]


def status(api, run_id):
    return api.get(f"/v1/openenv/runs/{run_id}").json()


def sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def collect(api, body) -> dict:
    response = post_run(api, body)
    assert response.status_code == 202, response.content
    run_queued_jobs("control")
    return status(api, response.json()["run_id"])


def test_a_train_run_collects_selects_trains_and_publishes(api, home, counter, served, policies,
                                                           django_capture_on_commit_callbacks):
    created = post_run(api, train_body(counter.url, idempotency_key="train:1"))
    assert created.status_code == 202, created.content
    first = created.json()
    contract = first["training_contract"]
    assert first["state"] == "discovering" and first["kind"] == "train"
    assert first["training_contract_sha256"] == json_digest(contract)
    assert contract["effective_config"]["output_name"] == "counter-agent"
    assert contract["behavior_policy"]["base_model_sha256"] == served["base_model_sha256"]
    # An exact retry answers the original run, without a second preflight or run.
    assert post_run(api, train_body(counter.url, idempotency_key="train:1")).status_code == 200

    run_queued_jobs("control")
    queued = status(api, first["run_id"])
    assert queued["state"] == "training_queued", queued
    assert queued["stage"] == "training" and queued["progress"]["rollouts_completed"] == 9
    selection = queued["training_selection"]
    assert {k: v for k, v in selection.items() if k != "warnings"} == {
        "groups_submitted": 2, "rollouts_submitted": 5, "no_output_rollouts_discarded": 1,
        "no_usable_output_groups_skipped": 0, "no_reward_gradient_groups_skipped": 1}
    assert queued["warnings"] == selection["warnings"] and len(selection["warnings"]) == 2
    assert selection["warnings"][0].startswith("group 1 (seed 101): skipped, all 3 remaining rewards equal 2")
    assert "group 2 (seed 102) candidate 0: discarded" in selection["warnings"][1]
    assert "MODEL_ACTION_NO_OUTPUT" in selection["warnings"][1]
    job = Job.objects.get(uuid=queued["training_job_id"])
    assert job.kind == "training.grpo" and queued["training_submission"]["job_id"] == str(job.uuid)
    assert queued["training_submission"]["effective_seed"] == "7"
    # The training job's config is exactly the contract's effective config.
    assert job.payload["config"] == contract["effective_config"]
    assert job.payload["training_data"]["rows"] == 2 and job.payload["training_data"]["rollouts"] == 5
    lineage = queued["training"]["training_data"]
    assert lineage["schema"] == "kiln.openenv-training-data.v1" and lineage["groups"] == 2
    assert (lineage["seed_min"], lineage["seed_max"], lineage["rollouts"]) == ("100", "102", 5)
    assert lineage["behavior_policy"] == contract["behavior_policy"]
    # the training job carries the same lineage (GET /v1/train/jobs/{id} and /v1/train/status/{id})
    assert job.payload["training_data"]["openenv"] == lineage
    for route in (f"/v1/train/jobs/{job.uuid}", f"/v1/train/status/{job.uuid}"):
        assert api.get(route).json()["training_data"]["openenv"] == lineage, route
    # The summary embeds the contract and the selection, and still verifies offline.
    folder = home / "adapters" / ".openenv" / "runs" / first["run_id"]
    summary = json.loads((folder / "summary.json").read_text())
    assert summary["training_contract"] == contract and summary["training_selection"] == selection
    assert verify(folder / "summary.json").report["groups"] == 3

    with django_capture_on_commit_callbacks(execute=True):
        run_queued_jobs("gpu")
    job.refresh_from_db()
    assert job.state == "completed", (job.error_code, job.error_message)
    done = status(api, first["run_id"])
    assert done["state"] == "completed" and done["stage"] == "training", done
    assert done["training"]["state"] == "completed" and done["training"]["progress"] == 1.0
    adapter = Adapter.objects.get(name="counter-agent")
    assert adapter.state == "published" and not adapter.loaded  # auto_load false
    kinds = [a["kind"] for a in done["artifacts"]]
    assert kinds == ["dataset", "replay", "summary", "train_receipt", "adapter_manifest"]
    receipt_bytes = (Path(adapter.path) / "train_receipt.json").read_bytes()
    receipt = json.loads(receipt_bytes)
    assert receipt["status"] == "success" and receipt["adapter_name"] == "counter-agent"
    assert receipt["training_data"]["sha256"] == job.payload["training_data"]["admitted_corpus_sha256"]
    assert receipt["training_data"]["openenv"] == lineage  # §2.9: training_data{source, path?, sha256?, openenv?}
    assert receipt["data"]["groups_trained"] == 2 and receipt["echo"]["enabled"] is True
    # GET /metrics counts what the completed run trained, from its receipt
    assert metric(api, "kiln_training_groups_total", disposition="trained") == 2
    assert metric(api, "kiln_training_groups_total", disposition="filtered") == receipt["data"]["groups_filtered"]
    assert metric(api, "kiln_training_optimizer_steps_total") == receipt["progress"]["global_step"] > 0
    assert metric(api, "kiln_training_completions_trained_total") == receipt["data"]["completions_trained"] > 0
    downloaded = api.get(f"/v1/openenv/runs/{first['run_id']}/artifacts/train_receipt")
    assert downloaded.status_code == 200 and b"".join(downloaded.streaming_content) == receipt_bytes
    manifest = json.loads(b"".join(api.get(f"/v1/openenv/runs/{first['run_id']}/artifacts/adapter_manifest")
                                   .streaming_content))
    assert manifest["content_sha256"] == adapter.content_sha256 and manifest["receipt_hash"] == sha(receipt_bytes)
    record = json.loads((folder / "run.json").read_text())
    assert record["state"] == "completed" and record["training_contract"] == contract
    # `kiln train status` sees the ordinary GRPO job.
    assert any(j["job_id"] == str(job.uuid) for j in api.get("/v1/train/status").json())
    error_of(api.delete(f"/v1/openenv/runs/{first['run_id']}"), 409, "openenv_run_not_cancellable")


def test_the_servers_training_defaults_fill_what_the_run_leaves_out(api, home, counter, served, policies, settings):
    # `kiln serve` on the demo writes [training.defaults] (adam_w at 3e-5); a train run that names
    # neither gets them sealed into its contract, and the GRPO job's receipt fields say where each
    # field came from: the run's own (lora_rank), Kiln's (output_name), the server's, the built-in.
    table = {"optimizer": {"kind": "adam_w"}, "learning_rate": 3e-5, "kl_coeff": 0.05}
    settings.KILN = replace(settings.KILN, training_defaults=table)
    body = train_body(counter.url, training_config={"lora_rank": 2, "lora_alpha": 4, "seed": 7, "kl_coeff": 0.2})
    created = post_run(api, body)
    assert created.status_code == 202, created.content
    effective = created.json()["training_contract"]["effective_config"]
    assert effective["optimizer"]["kind"] == "adam_w" and effective["learning_rate"] == 3e-5
    assert effective["kl_coeff"] == 0.2  # the run's own value beats the server's
    preflight = api.post("/v1/openenv/training/preflight", data=json.dumps(
        {"output_adapter": "pf-agent", "training_config": {"optimizer": {"kind": "muon"}}}),
        content_type="application/json").json()
    # a run that names another optimizer keeps that optimizer's own learning rate
    assert preflight["effective_config"]["optimizer"]["kind"] == "muon"
    assert preflight["effective_config"]["learning_rate"] is None

    run_queued_jobs("control")
    queued = status(api, created.json()["run_id"])
    assert queued["state"] == "training_queued", queued
    job = Job.objects.get(uuid=queued["training_job_id"])
    assert job.payload["config"] == effective
    sources = job.payload["config_sources"]
    assert (sources["optimizer"], sources["learning_rate"]) == ("server_defaults", "server_defaults")
    assert (sources["lora_rank"], sources["kl_coeff"], sources["output_name"]) == ("request",) * 3
    assert sources["clip_epsilon"] == "default"
    assert job.payload["server_training_defaults"] == {"optimizer": effective["optimizer"], "learning_rate": 3e-5}

    # a server default that cannot combine with the run's config is refused before any episode,
    # and the hint names the table
    settings.KILN = replace(settings.KILN, training_defaults={"optimizer": {"kind": "adam_w"}})
    bad = post_run(api, train_body(counter.url, idempotency_key="train:bad", output_adapter="other-agent",
                                   training_config={"lora_rank": 2, "lora_alpha": 4, "learning_rate": -1}))
    error = error_of(bad, 400, "training_invalid_request")
    assert "training_config.learning_rate" in error["message"] and "[training.defaults]" in error["hint"]


def test_nothing_left_after_selection_completes_without_a_training_job(api, home, counter, served, policies):
    policies.content = lambda request: json.dumps({"delta": 1})  # every candidate earns the same return
    done = collect(api, train_body(counter.url, groups=2, group_size=2))
    assert done["state"] == "completed" and done["stage"] == "training_submission", done
    assert "without a training job" in done["error"] and "training_job_id" not in done
    assert done["training_selection"]["groups_submitted"] == 0
    assert done["training_selection"]["no_reward_gradient_groups_skipped"] == 2 and len(done["warnings"]) == 2
    assert not Job.objects.filter(kind="training.grpo").exists() and not Adapter.objects.exists()
    assert [a["kind"] for a in done["artifacts"]] == ["dataset", "replay", "summary"]
    assert "invalid model action" not in done["error"]  # valid actions, equal returns: no such cause


def test_a_model_that_never_acts_validly_is_named_as_why_nothing_was_trained(api, home, counter, served, policies):
    policies.content = lambda request: "I would move by one."  # never a JSON action
    done = collect(api, train_body(counter.url, groups=2, group_size=2))
    assert done["state"] == "completed" and done["training_selection"]["groups_submitted"] == 0, done
    assert done["error"].endswith("4 of 4 episodes ended at an invalid model action (a reply that was not one JSON "
                                  "object matching the action schema, which scores the protocol-error reward, or no "
                                  "final answer after the reasoning, which is left out), so no group kept two "
                                  "different returns")
    assert len(done["error"]) <= 500  # the run's one-line reason column


def test_cancel_during_training_cancels_the_training_job(api, home, counter, served, policies,
                                                         django_capture_on_commit_callbacks):
    queued = collect(api, train_body(counter.url, groups=1))
    assert queued["state"] == "training_queued", queued
    with django_capture_on_commit_callbacks(execute=True):
        cancelled = api.delete(f"/v1/openenv/runs/{queued['run_id']}").json()
    assert cancelled["state"] == "cancelled" and "cancelled" in cancelled["error"]
    assert Job.objects.get(uuid=queued["training_job_id"]).state == "cancelled"
    assert not Adapter.objects.filter(name="counter-agent").exists()  # the reservation was released

    # Running: the cancel asks the trainer to stop; the run ends cancelled when the job does.
    running = collect(api, train_body(counter.url, groups=1, output_adapter="counter-agent-b"))
    job = Job.objects.get(uuid=running["training_job_id"])
    with django_capture_on_commit_callbacks(execute=True):
        job_services.job_claim_next(queue="gpu", worker_id="fake-gpu")
    assert status(api, running["run_id"])["state"] == "training_running"
    with django_capture_on_commit_callbacks(execute=True):
        asked = api.delete(f"/v1/openenv/runs/{running['run_id']}").json()
    assert asked["state"] == "training_running" and asked["cancel_requested"] is True
    job.refresh_from_db()
    assert job.cancel_requested
    with django_capture_on_commit_callbacks(execute=True):
        job_services.job_mark_cancelled(job=job)  # what the runner does at the next group boundary
    assert status(api, running["run_id"])["state"] == "cancelled"


def test_a_cancel_during_the_last_step_publishes_nothing_and_one_after_is_refused(
        api, home, counter, served, policies, monkeypatch, settings, django_capture_on_commit_callbacks):
    """QA found a cancel accepted (200) while the last step ran and then ignored: the adapter published
    and auto-loaded. The trainer's stop poll is half a second stale; publication reads the row."""
    import gpu_runtime.grpo.trainer as trainer

    real_train = trainer.train_grpo

    def cancelled_as_the_last_step_ends(request, **kwargs):
        result = real_train(request, **kwargs)
        Job.objects.filter(kind="training.grpo", state="running").update(cancel_requested=True)
        return result

    monkeypatch.setattr(trainer, "train_grpo", cancelled_as_the_last_step_ends)
    run = collect(api, train_body(counter.url, groups=1, output_adapter="counter-late"))
    assert run["state"] == "training_queued", run
    with django_capture_on_commit_callbacks(execute=True):
        run_queued_jobs("gpu")
    job = Job.objects.get(uuid=run["training_job_id"])
    assert (job.state, job.error_code) == ("cancelled", "job_cancelled")
    assert status(api, run["run_id"])["state"] == "cancelled"
    assert not Adapter.objects.filter(name="counter-late").exists()
    assert not (settings.KILN.layout.adapters / "counter-late").exists()  # the trained folder went with the cancel
    assert [e.message for e in job.events.all() if "before publication" in e.message]

    # Once the job is publishing, a cancel is refused with a reason, and the run is left as it was.
    monkeypatch.setattr(trainer, "train_grpo", real_train)
    second = collect(api, train_body(counter.url, groups=1, output_adapter="counter-late-b"))
    job = Job.objects.get(uuid=second["training_job_id"])
    with django_capture_on_commit_callbacks(execute=True):
        job_services.job_claim_next(queue="gpu", worker_id="fake-gpu")
    Job.objects.filter(id=job.id).update(publishing=True)
    refused = error_of(api.delete(f"/v1/openenv/runs/{second['run_id']}"), 409, "openenv_run_not_cancellable")
    assert "publishing its result" in refused["message"]
    after = status(api, second["run_id"])
    assert (after["state"], after["cancel_requested"]) == ("training_running", False)
    job.refresh_from_db()
    assert not job.cancel_requested


def test_cancel_while_post_evaluating_cancels_the_post_eval_and_the_run(api, home, counter, served, policies,
                                                                       django_capture_on_commit_callbacks):
    suite = {"name": "sums-check", "scorer": {"type": "numeric_tolerance", "tolerance": 0},
             "examples": [{"id": f"s{i}", "messages": [{"role": "user", "content": f"What is {i} + 1?"}],
                           "target": str(i + 1)} for i in range(3)]}
    assert api.post("/v1/eval/suites", data=json.dumps(suite), content_type="application/json").status_code == 200
    queued = collect(api, train_body(counter.url, groups=1, post_eval={"suite": "sums-check"}))
    assert queued["state"] == "training_queued", queued
    with django_capture_on_commit_callbacks(execute=True):
        run_queued_jobs("gpu")  # trains and publishes; the post-eval waits on the control queue
    evaluating = status(api, queued["run_id"])
    assert evaluating["state"] == "post_evaluating", evaluating
    [post_eval] = Job.objects.filter(kind="training.post_eval")
    assert post_eval.state == "queued"
    with django_capture_on_commit_callbacks(execute=True):
        cancelled = api.delete(f"/v1/openenv/runs/{queued['run_id']}").json()
    assert cancelled["state"] == "cancelled", cancelled
    post_eval.refresh_from_db()
    assert post_eval.state == "cancelled"
    assert [a["kind"] for a in cancelled["artifacts"]][-2:] == ["train_receipt", "adapter_manifest"]


def test_a_behavior_adapter_changed_under_the_run_fails_closed(api, home, counter, served, policies):
    adapter = publish_adapter(home, rank=2, alpha=4)  # train_body's shape
    body = train_body(counter.url, groups=1, adapter="counter-agent-v1", output_adapter="counter-agent-v2")

    # (a) its bytes change after submission, before the snapshot: refused before any episode.
    response = post_run(api, body)
    contract = response.json()["training_contract"]
    assert contract["behavior_policy"]["adapter"] == {"name": "counter-agent-v1",
                                                      "content_sha256": adapter.content_sha256}
    weights = Path(adapter.path) / "adapter_model.safetensors"
    weights.write_bytes(b"weights-v1-tampered")
    run_queued_jobs("control")
    failed = status(api, response.json()["run_id"])
    assert failed["state"] == "failed" and failed["failure"]["code"] == "training_evidence_invalid", failed
    assert failed["failure"]["stage"] == "admission" and policies.started == []
    weights.write_bytes(b"weights-v1")

    # (b) the registry's adapter changes during collection: the run fails before training.
    def swap(run):
        from core.content_identity import adapter_content_sha256

        weights.write_bytes(b"weights-v1-retrained")
        Adapter.objects.filter(id=adapter.id).update(content_sha256=adapter_content_sha256(Path(adapter.path)))

    policies.on_start = swap
    changed = collect(api, dict(body, idempotency_key="b"))
    assert changed["state"] == "failed" and changed["failure"]["code"] == "training_evidence_invalid", changed
    assert changed["failure"]["stage"] == "training_submission"
    assert changed["behavior_adapter_snapshot"]["content_sha256"] == adapter.content_sha256
    snapshot = home / "adapters" / ".openenv" / "runs" / changed["run_id"] / "behavior-adapter"
    assert (snapshot / "adapter_model.safetensors").read_bytes() == b"weights-v1"  # the private copy
    assert not Job.objects.filter(kind="training.grpo").exists()


def test_a_policy_or_served_model_drifting_from_the_contract_fails_closed(api, home, counter, served, policies):
    # A reply whose behavior policy is not the contract's fails the collection.
    policies.behavior = lambda run, request: dict(run.training_contract["behavior_policy"],
                                                  implementation="another sampler")
    drifted = collect(api, train_body(counter.url, groups=1))
    assert drifted["state"] == "failed" and drifted["failure"]["stage"] == "collection", drifted
    assert drifted["failure"]["code"] == "training_evidence_invalid"
    assert "implementation" in drifted["failure"]["message"] and drifted["artifacts"] == []

    # The served base model changes before training: refused at submission.
    policies.behavior = None
    policies.on_start = lambda run: heartbeat(dict(served, base_model_sha256="sha256:" + "9" * 64))
    swapped = collect(api, train_body(counter.url, groups=1, output_adapter="other"))
    assert swapped["state"] == "failed" and swapped["failure"]["stage"] == "training_submission", swapped
    assert "base_model_sha256" in swapped["failure"]["message"]
    assert not Job.objects.filter(kind="training.grpo").exists()


def test_restart_fails_a_run_whose_training_was_running_and_keeps_a_queued_one(
        api, home, counter, served, policies, django_capture_on_commit_callbacks):
    running = collect(api, train_body(counter.url, groups=1, output_adapter="a1"))
    waiting = collect(api, train_body(counter.url, groups=1, output_adapter="a2"))
    now = timezone.now()
    stale = now - timedelta(minutes=10)
    WorkerHeartbeat.objects.create(worker_id="dead-gpu", hostname=socket.gethostname(), pid=os.getpid(),
                                   queues=["gpu", "infer"], started_at=stale, last_seen=stale, status={})
    with django_capture_on_commit_callbacks(execute=True):
        job_services.job_claim_next(queue="gpu", worker_id="dead-gpu")
    assert status(api, running["run_id"])["state"] == "training_running"
    with django_capture_on_commit_callbacks(execute=True):
        report = runs_restore(worker_id="control-after-restart")
    assert report["interrupted"] == [running["run_id"]]
    failed = status(api, running["run_id"])
    assert failed["state"] == "failed" and failed["failure"]["code"] == "run_interrupted"
    assert failed["failure"]["stage"] == "restoration" and failed["failure"]["retryable"] is True
    assert Job.objects.get(uuid=running["training_job_id"]).error_code == "job_interrupted"
    kept = OpenEnvRun.objects.get(id=waiting["run_id"])
    assert kept.state == "training_queued" and kept.training_job.state == "queued"
