"""Activation goes through the serving canary: a failed canary quarantines the adapter and changes
nothing else; a canary that cannot run changes nothing at all; an approved promotion is applied by its
activation job, or fails with the reason (its canary failed, its job died, the incumbent moved);
`POST /v1/adapters/{name}/activate` (a rollback) is a promotion with the same approval rule.

The GPU worker's answers come from the stand-in in tests/support/canary.py (autouse in this folder);
tests/integration/test_activation_faults.py runs the real worker, and kills it."""

from __future__ import annotations

import pytest

from adapters.models import Adapter, AdapterTransition, Promotion
from adapters.promotions import promotion_approve, promotion_request
from adapters.selectors import adapter_active
from core.jobs.models import Job
from core.jobs.services import jobs_fail_interrupted
from core.models import Receipt
from tests.promotions.support import client_for, error, policy, published, send, users
from tests.support.canary import drain_activations

pytestmark = pytest.mark.django_db


@pytest.fixture
def solo(home, django_user_model):
    """One user (the approval policy is off): the request is its own approval."""
    from core.accounts.services import user_create

    user_create(username="solo", password="long-enough-pw", can_approve=True)
    published(home, "r1", loaded=True)
    published(home, "r2")
    return client_for("solo")


def test_a_load_runs_the_canary_and_records_it(solo, canary_worker):
    body = send(solo, "/v1/adapters/load", {"name": "r2", "reason": "try it"}).json()
    assert body["status"] == "active" and body["canary"]["passed"] is True and body["quarantined"] is False
    assert [c["adapter"] for c in canary_worker.calls] == ["r2", "r2", "r2"]
    assert all(c["temperature"] == 0.0 and c["rollout_provenance"] for c in canary_worker.calls)
    adapter = Adapter.objects.get(name="r2")
    activation = Receipt.objects.filter(kind="activation", subject="r2").get()
    assert activation.body["canary"] == {"sha256": adapter.canary["sha256"], "passed": True}
    assert [o["content"] for o in adapter.canary["outputs"]] == ["ready"] * 3
    assert adapter_active().name == "r2" and not Adapter.objects.get(name="r1").loaded  # one active adapter


@pytest.mark.parametrize("fault, reason", [("fail_load", "adapter_load_failed"), ("nan_for", "not finite"),
                                           ("wrong_bytes_for", "the worker served"),
                                           ("empty_for", "empty replies")])
def test_a_failed_canary_quarantines_and_the_previous_adapter_stays(solo, canary_worker, fault, reason):
    getattr(canary_worker, fault).add("r2")
    message = error(send(solo, "/v1/adapters/load", {"name": "r2"}), 500, "adapter_load_failed")
    assert "quarantined" in message and reason in message
    adapter = Adapter.objects.get(name="r2")
    assert adapter.quarantined and not adapter.loaded and adapter.canary["passed"] is False
    assert adapter_active().name == "r1"
    row = AdapterTransition.objects.filter(adapter="r2").last()
    assert row.to_state == "quarantined" and reason in row.reason
    assert solo.get("/v1/adapters/r2").json()["status"] == "quarantined"
    assert not Receipt.objects.filter(kind="activation", subject="r2").exists()
    # A quarantined adapter is neither served by name nor promoted.
    chat = {"model": "tiny", "adapter": "r2", "messages": [{"role": "user", "content": "hi"}]}
    response = send(solo, "/v1/chat/completions", chat)
    assert "quarantined" in error(response, 409, "adapter_quarantined")
    assert "--allow-quarantined" in response.json()["error"]["hint"]
    error(send(solo, "/v1/adapters/r2/activate", {"reason": "try"}), 409, "adapter_quarantined")
    assert not Promotion.objects.filter(candidate="r2").exists()

    getattr(canary_worker, fault).clear()  # fixed, but quarantined: only with the override
    error(send(solo, "/v1/adapters/load", {"name": "r2"}), 409, "adapter_quarantined")
    body = send(solo, "/v1/adapters/load", {"name": "r2", "allow_quarantined": True}).json()
    assert body["status"] == "active" and body["quarantined"] is False
    assert Receipt.objects.get(kind="activation", subject="r2").body["allow_quarantined"] is True


def test_a_canary_that_cannot_run_changes_nothing(solo, canary_worker):
    canary_worker.unavailable = True
    error(send(solo, "/v1/adapters/load", {"name": "r2"}), 503, "inference_unavailable")
    adapter = Adapter.objects.get(name="r2")
    assert not adapter.quarantined and not adapter.loaded and adapter.canary is None
    assert adapter_active().name == "r1"


def test_a_queued_activation_outwaits_a_gpu_worker_that_is_restarting(home, canary_worker, monkeypatch):
    """QA: the GPU worker killed as a training finished; its auto_load activation failed
    inference_unavailable at once and nothing retried it. A queued activation asks again while no
    worker serves (up to the canary timeout); a request's own load still answers at once."""
    from adapters import canary

    monkeypatch.setattr(canary, "WORKER_POLL_SECONDS", 0.01)
    requester, reviewer, _ = users()
    published(home, "inc", loaded=True)
    published(home, "cand")
    promotion = promotion_request(candidate="cand", user=requester, reason="")
    promotion_approve(promotion_id=promotion.id, user=reviewer, reason="looks fine")
    canary_worker.unavailable_for_calls = 3  # the restarted worker is still loading its model
    drain_activations()
    promotion.refresh_from_db()
    assert promotion.state == "applied" and adapter_active().name == "cand"
    assert canary_worker.unavailable_for_calls == 0 and len(canary_worker.calls) == 3 + 3  # three refusals, three prompts


def test_an_approved_promotion_whose_canary_fails_ends_failed(home, canary_worker):
    requester, reviewer, _ = users()
    published(home, "inc", loaded=True)
    published(home, "cand")
    promotion = promotion_request(candidate="cand", user=requester, reason="")
    promotion_approve(promotion_id=promotion.id, user=reviewer, reason="looks fine")
    canary_worker.fail_load.add("cand")
    drain_activations()
    promotion.refresh_from_db()
    assert promotion.state == "failed" and "adapter_load_failed" in promotion.reason
    assert adapter_active().name == "inc" and Adapter.objects.get(name="cand").quarantined
    job = Job.objects.get(id=promotion.activation_job_id)
    assert job.state == "failed" and job.error_code == "adapter_load_failed"
    assert job.result["activated"] is False and job.result["quarantined"] is True
    # GET /metrics: the failed promotion by its state, with no adapter named
    from core.metrics.selectors import exposition
    from tests.support.metrics import label_values, samples

    text = exposition()
    assert {dict(labels)["state"]: value for (name, labels), value in samples(text).items()
            if name == "kiln_promotions"} == {
        "pending": 0, "approved": 0, "rejected": 0, "applied": 0, "superseded": 0, "failed": 1}
    assert not label_values(text) & {"cand", "inc"}


def test_an_activation_job_that_dies_fails_its_promotion(home, canary_worker, django_capture_on_commit_callbacks):
    requester, reviewer, _ = users()
    published(home, "inc", loaded=True)
    published(home, "cand")
    promotion = promotion_request(candidate="cand", user=requester, reason="")
    promotion_approve(promotion_id=promotion.id, user=reviewer, reason="ok")
    job = Job.objects.get(id=Promotion.objects.get(id=promotion.id).activation_job_id)
    Job.objects.filter(id=job.id).update(state="running")  # its worker took it, then died (restart recovery)
    with django_capture_on_commit_callbacks(execute=True):
        assert jobs_fail_interrupted(job_ids=[job.id], reason="its worker stopped while the job was running") == 1
    promotion.refresh_from_db()
    assert promotion.state == "failed" and "job_interrupted" in promotion.reason
    assert "previous adapter stays active" in promotion.reason
    assert adapter_active().name == "inc" and not Adapter.objects.get(name="cand").loaded


def test_an_incumbent_that_changed_while_the_canary_waited_fails_the_promotion(home, canary_worker):
    from adapters.activation import make_active

    requester, reviewer, _ = users()
    published(home, "inc", loaded=True)
    published(home, "cand")
    published(home, "other")
    promotion = promotion_request(candidate="cand", user=requester, reason="")
    promotion_approve(promotion_id=promotion.id, user=reviewer, reason="ok")
    make_active(name="other", reason="loaded by hand meanwhile")
    drain_activations()
    promotion.refresh_from_db()
    assert promotion.state == "failed" and "other is active now" in promotion.reason
    assert adapter_active().name == "other"
    job = Job.objects.get(id=Promotion.objects.get(id=promotion.id).activation_job_id)
    # The job's error gives the cause, not the approver's "ok" before it (QA).
    assert job.error_code == "promotion_failed" and \
        job.error_message.startswith(f"promotion {promotion.id} was not applied: it was requested against inc")


def test_an_auto_load_whose_canary_finishes_after_a_later_activation_does_not_replace_it(home, canary_worker):
    """QA: two trainings finished about a second apart; their auto_load canaries ran side by side and the
    older one, finishing last, replaced the newer adapter. The later decision holds."""
    from adapters.activation import activation_submit, make_active

    published(home, "inc", loaded=True)
    published(home, "older")
    published(home, "newer")
    older = activation_submit(name="older", reason="auto_load after training (no gate)")
    make_active(name="newer", reason="auto_load after training (no gate)")  # its canary finished first
    drain_activations()
    older.refresh_from_db()
    assert adapter_active().name == "newer"
    assert older.state == "failed" and older.error_code == "activation_superseded"
    assert older.error_message.startswith("newer was made active at ") and "the later decision holds" in older.error_message
    assert older.result["activated"] is False
    again = activation_submit(name="older", reason="asked again")  # a new request is newer still: it applies
    drain_activations()
    again.refresh_from_db()
    assert again.state == "completed" and adapter_active().name == "older"


def test_activate_alone_is_a_promotion_applied_at_once(solo):
    response = send(solo, "/v1/adapters/r2/activate", {"reason": "roll forward"})
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["state"] == "approved" and body["candidate"] == "r2" and body["incumbent"] == "r1"
    approval = Receipt.objects.get(kind="approval", subject="r2")
    assert approval.body["policy"] == "approval_not_required" and approval.body["actor"] == "solo"
    drain_activations()
    assert solo.get(f"/v1/promotions/{body['id']}").json()["state"] == "applied"
    assert adapter_active().name == "r2"
    # The rollback to r1 is recorded the same way.
    back = send(solo, "/v1/adapters/r1/activate", {"reason": "r2 regressed"}).json()
    drain_activations()
    assert Promotion.objects.get(id=back["id"]).state == "applied" and adapter_active().name == "r1"
    assert Receipt.objects.filter(kind="activation", subject="r1", body__promotion_id=back["id"]).exists()
    error(send(solo, "/v1/adapters/r1/activate", {}), 409, "adapter_active")
    error(send(solo, "/v1/adapters/nope/activate", {}), 404, "adapter_not_found")


def test_activate_in_a_team_waits_for_a_reviewer(home, settings):
    users()
    published(home, "r1")
    published(home, "r2", loaded=True)
    requester, reviewer = client_for("requester"), client_for("reviewer")
    body = send(requester, "/v1/adapters/r1/activate", {"reason": "rollback"}).json()
    assert body["state"] == "pending" and adapter_active().name == "r2"
    error(send(requester, f"/v1/promotions/{body['id']}/approve", {"reason": "mine"}), 403,
          "approval_permission_required")
    assert send(reviewer, f"/v1/promotions/{body['id']}/approve", {"reason": "ok"}).json()["state"] == "approved"
    drain_activations()
    assert adapter_active().name == "r1"
    policy(settings, require_approval=False)  # the policy, not the number of users, decides when set
    assert send(requester, "/v1/adapters/r2/activate", {}).json()["state"] == "approved"


def test_a_request_without_an_adapter_is_served_by_the_active_one(home):
    from adapters.serving.selectors import default_adapter

    assert default_adapter() == "base"
    published(home, "r1", loaded=True)
    assert default_adapter() == "r1"


def test_the_training_jobs_activation_state_follows_the_promotion_that_activated_it(home):
    from core.jobs.services import job_submit
    from tests.promotions.support import approve
    from training.selectors import training_detail

    requester, reviewer, _ = users()
    published(home, "inc", loaded=True)
    training = job_submit(kind="test.steps", payload={"steps": 1}, title="training cand")
    from django.utils import timezone

    Job.objects.filter(id=training.id).update(kind="training.grpo", state="completed", finished_at=timezone.now(), payload={
        "route": "/v1/train/grpo", "adapter_name": "cand", "snapshot_path": "/nonexistent",
        "config": {"seed": "1", "output_name": "cand"}, "training_data": {"source": "inline"}})
    training = Job.objects.get(id=training.id)
    published(home, "cand", job=training)
    assert training_detail(training)["states"]["activation"]["promotion_id"] is None
    promotion = promotion_request(candidate="cand", user=requester, reason="")  # asked for later, by hand
    pending = training_detail(training)["states"]["activation"]
    assert pending["promotion_id"] == promotion.id and pending["active"] is False and pending["at"] is None
    applied = approve(promotion.id, reviewer, "ok")
    activation = training_detail(training)["states"]["activation"]
    assert activation["active"] is True and activation["promotion_id"] == promotion.id
    assert activation["activation_job_id"] == str(applied.activation_job.uuid)
    assert activation["at"] == Job.objects.get(id=applied.activation_job_id).finished_at is not None
    # `kiln train status --job-id` prints the three states with their times (README, "Promotion")
    from kiln_project.cli.train_cmd import detail_lines

    detail = client_for("reviewer").get(f"/v1/train/jobs/{training.uuid}").json()
    lines = detail_lines(detail)
    assert f"training       completed at {detail['states']['training']['at']}" in lines
    assert "evaluation     none (no post_eval)" in lines
    [shown] = [line for line in lines if line.startswith("activation ")]
    assert shown == (f"activation     active at {detail['states']['activation']['at']} (promotion {promotion.id}; "
                     f"activation job {applied.activation_job.uuid})")
    # Replaced later: inactive since then, and the line says when it stopped, not when it started.
    from adapters.activation import make_active

    make_active(name="inc", reason="rolled back")
    replaced = training_detail(training)["states"]["activation"]
    assert replaced["active"] is False and replaced["deactivated_at"] > replaced["at"]
    detail = client_for("reviewer").get(f"/v1/train/jobs/{training.uuid}").json()
    [shown] = [line for line in detail_lines(detail) if line.startswith("activation ")]
    assert shown.startswith(f"activation     inactive since {detail['states']['activation']['deactivated_at']} "
                            f"(active from {detail['states']['activation']['at']})")


def test_train_status_prints_the_gates_evidence():
    from kiln_project.cli.train_cmd import detail_lines

    evidence = {"outcome": "promoted", "baseline_accuracy": 0.25, "baseline_adapter": None, "candidate_accuracy": 0.75,
                "minimum_accuracy": 0.5, "improved": 9, "regressed": 1, "tied": 10, "paired_examples": 20,
                "exact_sign_test_p_value": 0.0107, "eval_job_id": "e1"}
    detail = {"job_id": "j1", "state": "completed", "gate_outcome": "promoted", "post_eval_gate_evidence": [evidence],
              "states": {"training": {"state": "completed", "at": "T1"},
                         "evaluation": {"job_id": "p1", "eval_job_id": "e1", "state": "completed",
                                        "outcome": "promoted", "at": "T2"},
                         "activation": {"active": True, "at": "T3", "activation_job_id": None, "promotion_id": None}}}
    lines = detail_lines(detail)
    assert ("evaluation     completed (promoted) at T2, post-eval job p1, eval job e1 (kiln eval status ID)"
            in lines) and "activation     active at T3" in lines
    assert ("evidence       promoted: accuracy 0.25 (base) -> 0.75 (minimum 0.5), improved 9 regressed 1 tied 10 "
            "of 20, p 0.0107, eval job e1") in lines
    # Before the post-eval starts, a run with post_eval says so; a gate that ended `error` says why.
    running = {"job_id": "j2", "state": "running", "post_eval": {"suite": "math-holdout", "min_accuracy": 0.5},
               "states": {"training": {"state": "running", "at": None}, "evaluation": None, "activation": None}}
    assert ("evaluation     not started (post_eval on suite 'math-holdout' runs once the adapter publishes)"
            in detail_lines(running))
    errored = {**detail, "states": {**detail["states"], "evaluation": {
        "job_id": "e2", "state": "completed", "outcome": "error", "at": "T4",
        "reason": "the evaluation could not be queued: inference_disabled_by_profile"}}}
    assert ("evaluation     completed (error) at T4, post-eval job e2: the evaluation could not be queued: "
            "inference_disabled_by_profile") in detail_lines(errored)
    # Its evidence has no figures: the reason, not "accuracy None -> None ... p None".
    errored["post_eval_gate_evidence"] = [{"outcome": "error", "eval_job_id": None, "baseline_adapter": "a2",
                                           "reason": "suite 'math-holdout' was removed after admission"}]
    lines = detail_lines(errored)
    assert "evidence       error: suite 'math-holdout' was removed after admission" in lines
    assert not any("None" in line for line in lines if line.startswith("evidence"))
    # A run with a published checkpoint names it and the command that resumes from it.
    stopped = {"job_id": "j3", "state": "failed", "adapter_name": "math-r001",
               "latest_checkpoint": {"resume_checkpoint": "math-r001-checkpoint-step-00000025.kiln-checkpoint",
                                     "global_step": 25},
               "states": {"training": {"state": "failed", "at": "T5"}, "evaluation": None, "activation": None}}
    # Inline groups (no replay_request): the same request again with the checkpoint; a file or a named
    # dataset: kiln train resume, which resends the job's own request.
    assert ("checkpoint     math-r001-checkpoint-step-00000025.kiln-checkpoint (step 25); resume with: the same "
            "request again (its groups, config and post_eval) with config.resume_checkpoint "
            "math-r001-checkpoint-step-00000025.kiln-checkpoint") in detail_lines(stopped)
    replayable = {**stopped, "replay_request": {"route": "/v1/train/grpo", "body": {"dataset_path": "/x", "config": {}}}}
    assert ("checkpoint     math-r001-checkpoint-step-00000025.kiln-checkpoint (step 25); resume with: kiln train "
            "resume --job-id j3") in detail_lines(replayable)
