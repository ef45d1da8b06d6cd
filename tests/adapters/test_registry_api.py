"""/v1/adapters: list, one, detail (files, history, training job, evaluations, lineage), load, unload
and delete, with the transitions each change records (who, why, which job) and the 409s."""

from __future__ import annotations

import pytest

from adapters.activation import make_active
from adapters.models import Adapter, AdapterTransition, AdapterTransitionError
from adapters.services import adapter_demote, adapter_release, adapter_reserve
from core.jobs.models import Job
from core.jobs.services import job_submit
from core.models import Receipt, ReceiptKind
from core.receipts import receipt_record
from tests.adapters.support import error, ok, publish, registry_entries, send

pytestmark = pytest.mark.django_db


def _job(kind: str = "training.grpo", *, state: str = "completed", user=None, payload=None, result=None) -> Job:
    job = job_submit(kind="test.steps", payload={"steps": 1}, title=f"{kind} job", user=user)
    Job.objects.filter(id=job.id).update(kind=kind, state=state, payload=payload or job.payload, result=result or {})
    return Job.objects.get(id=job.id)


def _history(name: str) -> list[tuple]:
    return [(t.from_state, t.to_state, t.actor.username if t.actor else None, t.reason)
            for t in AdapterTransition.objects.filter(adapter=name).order_by("at", "id")]


def test_list_shows_status_active_parent_job_and_receipt_digest(api, home, peft_adapter):
    from django.contrib.auth import get_user_model

    trainer = get_user_model().objects.get(username="trainer")
    job = _job(user=trainer)
    publish(home, peft_adapter, "r1", loaded=True, job=job)
    receipt = receipt_record(kind=ReceiptKind.TRAIN, subject="r1", body={"adapter_name": "r1"}, job=job)
    publish(home, peft_adapter, "r2", base_adapter="r1")
    adapter_reserve(name="r3")
    rows = {a["name"]: a for a in ok(api.get("/v1/adapters"))}
    assert [a["name"] for a in ok(api.get("/v1/adapters"))] == ["r3", "r2", "r1"]  # newest first
    assert rows["r1"]["status"] == "active" and rows["r1"]["active"] is True and rows["r1"]["loaded"] is True
    assert rows["r1"]["training_job_id"] == str(job.uuid) and rows["r1"]["training_job_state"] == "completed"
    assert rows["r1"]["receipt_sha256"] == receipt.sha256
    assert rows["r2"]["status"] == "available" and rows["r2"]["active"] is False and rows["r2"]["base_adapter"] == "r1"
    assert rows["r3"]["status"] == "writing" and rows["r3"]["content_sha256"] is None
    assert ok(api.get("/v1/adapters/r2")) == rows["r2"]
    error(api.get("/v1/adapters/nope"), 404, "adapter_not_found")
    failed = _job(state="failed")
    adapter_reserve(name="r4", job=failed)  # the release hook has not run yet
    assert ok(api.get("/v1/adapters/r4"))["status"] == "failed"


def test_detail_has_files_history_training_job_evaluations_and_lineage(api, home, peft_adapter):
    from adapters.content import file_sha256

    publish(home, peft_adapter, "root")
    publish(home, peft_adapter, "mid", base_adapter="root")
    gate = {"outcome": "promoted", "minimum_accuracy": 0.5}
    post_eval = _job("training.post_eval", result={"gate_outcome": "promoted", "post_eval_verdict": "held: 3/4 pass",
                                                  "post_eval_gate_evidence": [gate], "linked_eval_job_ids": ["e1"]})
    training = _job(result={"post_eval_job_id": str(post_eval.uuid), "final_step": 4, "total_steps": 4})
    publish(home, peft_adapter, "leaf", job=training, base_adapter="mid")
    receipt_record(kind=ReceiptKind.POST_EVAL_GATE, subject="leaf", body={"evidence": gate}, job=post_eval)
    _job("eval.run", payload={"mode": "compare", "suite": {"name": "held"},
                              "targets": [{"adapter": "mid"}, {"adapter": "leaf"}]},
         result={"targets": [{"index": 0, "accuracy": 0.25, "total": 4}, {"index": 1, "accuracy": 0.75, "total": 4}]})
    make_active(name="leaf", reason="post_eval gate passed", job=post_eval)
    detail = ok(api.get("/v1/adapters/leaf/detail"))
    assert detail["status"] == "active" and detail["active"] is True
    folder = home / "adapters" / "leaf"
    assert detail["files"] == [{"file": n, "size": (folder / n).stat().st_size, "sha256": file_sha256(folder / n),
                                "defines_adapter": True} for n in ("adapter_config.json", "adapter_model.safetensors")]
    assert [(t["from_state"], t["to_state"], t["reason"]) for t in detail["transitions"]] == [
        (None, "writing", f"reserved for training job {training.uuid}"), ("writing", "available", "published"),
        ("available", "active", "post_eval gate passed")]
    assert detail["transitions"][2]["job_id"] == str(post_eval.uuid)
    assert detail["training_job"]["job_id"] == str(training.uuid) and detail["training_job"]["final_step"] == 4
    assert detail["evaluations"]["post_eval"]["gate_outcome"] == "promoted"
    assert detail["evaluations"]["post_eval"]["evidence"] == [gate]
    assert [r["outcome"] for r in detail["evaluations"]["gate_receipts"]] == ["promoted"]
    [eval_job] = detail["evaluations"]["eval_jobs"]
    assert eval_job["accuracy"] == 0.75 and eval_job["suite"] == "held" and eval_job["targets"] == ["mid", "leaf"]
    assert [(p["name"], p["status"]) for p in detail["lineage"]] == [("mid", "available"), ("root", "available")]
    assert [r["kind"] for r in detail["receipts"]] == ["post_eval_gate", "activation"]
    publish(home, peft_adapter, "orphan", base_adapter="gone")
    assert ok(api.get("/v1/adapters/orphan/detail"))["lineage"] == [{"name": "gone", "missing": True}]
    error(api.get("/v1/adapters/nope/detail"), 404, "adapter_not_found")
    # A new adapter under the name shows none of the earlier one's gate receipts and eval jobs.
    import shutil

    make_active(name="mid", reason="swap")
    Adapter.objects.filter(name="leaf").delete()
    shutil.rmtree(folder)
    publish(home, peft_adapter, "leaf")
    again = ok(api.get("/v1/adapters/leaf/detail"))["evaluations"]
    assert again["gate_receipts"] == [] and again["eval_jobs"] == [] and again["post_eval"] is None


def test_load_and_unload_record_who_and_why(api, home, peft_adapter):
    publish(home, peft_adapter, "a1")
    body = ok(send(api, "post", "/v1/adapters/load", {"name": "a1", "reason": "try it"}))
    assert body["status"] == "active" and body["active"] is True
    ok(send(api, "post", "/v1/adapters/load", {"name": "a1"}))  # already active: no second transition
    receipt = Receipt.objects.get(kind=ReceiptKind.ACTIVATION, subject="a1")
    assert receipt.body["actor"] == "trainer" and receipt.body["content_sha256"] == body["content_sha256"]
    body = ok(send(api, "post", "/v1/adapters/unload", {"name": "a1", "reason": "done"}))
    assert body["status"] == "available" and body["active"] is False
    assert _history("a1") == [("", "writing", None, "reserved"), ("writing", "available", None, "published"),
                              ("available", "active", "trainer", "try it"), ("active", "available", "trainer", "done")]
    error(send(api, "post", "/v1/adapters/load", {"name": "nope"}), 404, "adapter_not_found")
    adapter_reserve(name="busy")
    error(send(api, "post", "/v1/adapters/load", {"name": "busy"}), 409, "adapter_busy")
    error(send(api, "post", "/v1/adapters/unload", {"name": "busy"}), 409, "adapter_busy")
    error(send(api, "post", "/v1/adapters/load", {}), 422, "validation_error")
    # "yes" is no boolean (QA: it loaded a quarantined adapter); nothing changes.
    said = error(send(api, "post", "/v1/adapters/load", {"name": "a1", "allow_quarantined": "yes"}), 422,
                 "validation_error")
    assert said.startswith("allow_quarantined")
    assert len(_history("a1")) == 4


def test_in_a_team_activation_needs_the_approve_permission(api, home, peft_adapter, make_client):
    publish(home, peft_adapter, "a1")
    viewer = make_client("viewer", can_submit=False)
    error(send(viewer, "post", "/v1/adapters/load", {"name": "a1"}), 403, "permission_denied")
    # two users now: the submitter without approve_promotion may not change what serves
    error(send(api, "post", "/v1/adapters/load", {"name": "a1"}), 403, "activation_needs_approval")
    approver = make_client("approver", can_approve=True)
    assert ok(send(approver, "post", "/v1/adapters/load", {"name": "a1"}))["status"] == "active"
    error(send(api, "post", "/v1/adapters/unload", {"name": "a1"}), 403, "activation_needs_approval")
    assert ok(send(approver, "post", "/v1/adapters/unload", {"name": "a1"}))["status"] == "available"
    assert [h[2] for h in _history("a1")[2:]] == ["approver", "approver"]


def test_the_activation_right_follows_the_configured_approval_policy(api, home, peft_adapter, make_client, settings):
    """[promotion] require_approval decides, not the user count: off, a submitter in a team loads; on, a
    submitter alone on the machine may not (an approver's promotion is the way)."""
    from dataclasses import replace

    publish(home, peft_adapter, "a1")
    settings.KILN = replace(settings.KILN, promotion_require_approval=True)
    response = send(api, "post", "/v1/adapters/load", {"name": "a1"})
    error(response, 403, "activation_needs_approval")
    assert "kiln adapters activate NAME" in response.json()["error"]["hint"]
    make_client("second", can_approve=False)
    settings.KILN = replace(settings.KILN, promotion_require_approval=False)
    assert ok(send(api, "post", "/v1/adapters/load", {"name": "a1"}))["status"] == "active"


def _checkpoint(home, name: str, step: int):
    folder = home / "adapters" / f"{name}-checkpoint-step-{step:08d}.kiln-checkpoint"
    folder.mkdir()
    (folder / "checkpoint_manifest.json").write_text("{}")
    return folder


def test_delete_removes_the_folder_and_its_checkpoints_and_keeps_receipts(api, home, peft_adapter):
    publish(home, peft_adapter, "math")
    publish(home, peft_adapter, "math-b")
    receipt_record(kind=ReceiptKind.TRAIN, subject="math", body={"adapter_name": "math"})
    _checkpoint(home, "math", 2)
    _checkpoint(home, "math", 4)
    kept = _checkpoint(home, "math-b", 2)  # another adapter's checkpoint, though its name starts alike
    body = ok(api.delete("/v1/adapters/math?reason=superseded"))
    assert body["name"] == "math" and body["status"] == "deleted" and len(body["removed"]) == 3
    assert registry_entries(home) == ["math-b", kept.name]
    assert not Adapter.objects.filter(name="math").exists()
    assert Receipt.objects.filter(subject="math").count() == 1  # receipts stay as rows
    assert _history("math")[-1] == ("available", "deleted", "trainer", "superseded")
    error(api.delete("/v1/adapters/math"), 404, "adapter_not_found")
    assert ok(api.get("/v1/adapters/math-b"))["status"] == "available"


def test_delete_refuses_an_active_or_writing_adapter(api, home, peft_adapter, make_client):
    publish(home, peft_adapter, "live", loaded=True)
    error(api.delete("/v1/adapters/live"), 409, "adapter_active")
    running = _job(state="running")
    adapter_reserve(name="writing", job=running)
    error(api.delete("/v1/adapters/writing"), 409, "adapter_busy")
    assert sorted(Adapter.objects.values_list("name", flat=True)) == ["live", "writing"]
    assert (home / "adapters" / "live").is_dir()
    failed = _job(state="failed")
    adapter_reserve(name="stale", job=failed)  # its job ended: the reservation may go
    assert ok(api.delete("/v1/adapters/stale"))["removed"] == []
    viewer = make_client("viewer", can_submit=False)
    error(viewer.delete("/v1/adapters/live"), 403, "permission_denied")


def test_delete_refuses_the_base_of_a_training_still_to_run(api, home, peft_adapter):
    """Round two warm-starts from round one: deleting round one while round two waits in the queue
    would fail it at its start, so the delete is refused until that job ends."""
    publish(home, peft_adapter, "math-r001")
    queued = _job(state="queued")
    adapter_reserve(name="math-r002", job=queued, base_adapter="math-r001")
    message = error(api.delete("/v1/adapters/math-r001"), 409, "adapter_in_use")
    assert "math-r002" in message and str(queued.uuid) in message
    assert (home / "adapters" / "math-r001").is_dir() and Adapter.objects.filter(name="math-r001").exists()
    Job.objects.filter(id=queued.id).update(state="cancelled")  # the round ended without publishing
    assert ok(api.delete("/v1/adapters/math-r001"))["status"] == "deleted"


def test_delete_keeps_an_adapter_others_were_trained_from_unless_forced(api, home, peft_adapter):
    """QA: deleting math-r001 broke the lineage of math-r002 (trained from it) without a word; now it is
    refused with the children named, and force=true deletes it anyway."""
    publish(home, peft_adapter, "math-r001")
    publish(home, peft_adapter, "math-r002", base_adapter="math-r001")
    message = error(api.delete("/v1/adapters/math-r001"), 409, "adapter_has_descendants")
    assert "'math-r002'" in message and "lineage" in message
    assert (home / "adapters" / "math-r001").is_dir() and Adapter.objects.filter(name="math-r001").exists()
    assert ok(api.delete("/v1/adapters/math-r002"))["status"] == "deleted"  # a leaf goes as before
    publish(home, peft_adapter, "math-r003", base_adapter="math-r001")
    assert ok(api.delete("/v1/adapters/math-r001?force=true"))["status"] == "deleted"
    assert not (home / "adapters" / "math-r001").exists()
    assert _history("math-r001")[-1][1] == "deleted"
    assert _history("math-r001")[-1][3] == "deleted by hand (forced: the base adapter of math-r003)"


def test_the_training_services_record_their_transitions(home, peft_adapter, django_user_model):
    user = django_user_model.objects.create_user(username="sub", password="long-enough-pw")
    job = _job(user=user)
    publish(home, peft_adapter, "t1", job=job, loaded=True)
    assert _history("t1") == [("", "writing", "sub", f"reserved for training job {job.uuid}"),
                              ("writing", "active", "sub", "published and activated (auto_load)")]
    failed = _job(state="failed")
    adapter_reserve(name="t2", job=failed)
    adapter_release(name="t2")
    assert _history("t2")[-1] == ("writing", "failed", None, f"training job {failed.uuid} ended failed without publishing")
    adapter_release(name="t2")  # nothing reserved: nothing recorded
    assert len(_history("t2")) == 2
    publish(home, peft_adapter, "t3")
    moved = adapter_demote(name="t3")
    last = AdapterTransition.objects.filter(adapter="t3").last()
    assert (last.from_state, last.to_state) == ("available", "failed") and str(moved) in last.reason
    assert last.content_sha256.startswith("sha256:")


def test_transitions_are_append_only(home, peft_adapter):
    publish(home, peft_adapter, "a1")
    transition = AdapterTransition.objects.first()
    transition.reason = "rewritten"
    with pytest.raises(AdapterTransitionError):
        transition.save()
    with pytest.raises(AdapterTransitionError):
        transition.delete()
    assert AdapterTransition.objects.get(id=transition.id).reason == "reserved"


def test_malformed_names_are_400_and_unimplemented_routes_501(api, home):
    for path in ("/v1/adapters/load", "/v1/adapters/unload"):
        for name in ("bad name!", "../x", "base"):
            error(send(api, "post", path, {"name": name}), 400, "invalid_adapter_name")
    error(api.get("/v1/adapters/has%20space"), 400, "invalid_adapter_name")
    error(api.get("/v1/adapters/fine-name"), 404, "adapter_not_found")
    merge = error(send(api, "post", "/v1/adapters/merge", {"adapters": ["a", "b"]}), 501, "not_implemented")
    assert "merging adapters" in merge
    for action in ("compile", "validate"):
        error(send(api, "post", f"/v1/judgments/rubric/{action}", {}), 501, "not_implemented")
    error(send(api, "post", "/v1/judgments/rubric/explode", {}), 404, "not_found")
    # reference-spec §1.5's modeled estimates (spec audit: they answered 404 as if never declared)
    for estimate in ("capacity", "compatibility", "tiers", "tier_defaults"):
        assert error(api.get(f"/v1/preflight/{estimate}"), 501, "not_implemented") == (
            f"the modeled {estimate} estimate is not implemented by this Kiln")
        error(send(api, "post", f"/v1/preflight/{estimate}", {}), 501, "not_implemented")
    error(api.get("/v1/preflight/elsewhere"), 404, "not_found")
    paths = api.get("/v1/openapi.json").json()["paths"]
    assert "/v1/adapters/merge" in paths and "/v1/judgments/{name}/{action}" in paths
    assert set(paths["/v1/preflight/{estimate}"]) >= {"get", "post"}


def test_an_approvers_direct_load_respects_the_review(api, home, peft_adapter, make_client):
    """With approval required, load by an approver neither approves their own pending request nor
    overrides a rejection; a candidate of an open promotion is not deleted under its reviewer."""
    publish(home, peft_adapter, "a1")
    approver = make_client("approver", can_approve=True)  # two users: approval is required
    make_client("second-approver", can_approve=True)  # someone else could approve: no self-approval
    promotion = ok(send(approver, "post", "/v1/promotions", {"candidate": "a1", "reason": "try it"}))
    assert promotion["state"] == "pending"
    error(send(approver, "post", "/v1/adapters/load", {"name": "a1"}), 409, "promotion_self_approval")
    error(send(approver, "delete", "/v1/adapters/a1"), 409, "adapter_promotion_open")
    ok(send(approver, "post", f"/v1/promotions/{promotion['id']}/reject", {"reason": "not yet"}))
    error(send(approver, "post", "/v1/adapters/load", {"name": "a1"}), 409, "adapter_promotion_rejected")
    assert not Adapter.objects.get(name="a1").loaded
    ok(send(approver, "delete", "/v1/adapters/a1"))  # decided: it may go


@pytest.mark.parametrize("stream", [False, True])
def test_a_completion_for_an_unpublished_adapter_is_404_before_anything_streams(api, home, stream):
    response = send(api, "post", "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                          "adapter": "never-published", "stream": stream})
    assert response["Content-Type"].startswith("application/json")
    assert "GET /v1/adapters" in response.json()["error"]["hint"]
    error(response, 404, "adapter_not_found")


@pytest.mark.parametrize("unsupported", [{"logprobs": True}, {"top_logprobs": 2}, {"tools": [{"type": "function"}]},
                                         {"logit_bias": {"1": 2.0}}])
def test_unsupported_openai_fields_are_refused_not_silently_dropped(api, home, unsupported):
    body = {"messages": [{"role": "user", "content": "hi"}], **unsupported}
    message = error(send(api, "post", "/v1/chat/completions", body), 422, "validation_error")
    assert next(iter(unsupported)) in message


def test_logprobs_false_is_accepted(api, home):
    body = {"messages": [{"role": "user", "content": "hi"}], "logprobs": False, "top_logprobs": 0}
    assert send(api, "post", "/v1/chat/completions", body).status_code != 422  # passes validation


def test_anonymous_loopback_access_is_no_approver_in_a_team(api, home, peft_adapter, make_client, settings):
    """A program without credentials loaded and unloaded adapters (its transitions without an actor)
    while the team's own submitters needed an approver to; alone on the machine it still may."""
    from dataclasses import replace

    from django.test import Client

    settings.KILN = replace(settings.KILN, allow_anonymous_api=True)
    publish(home, peft_adapter, "a1")
    anonymous = Client(REMOTE_ADDR="127.0.0.1")
    assert ok(send(anonymous, "post", "/v1/adapters/load", {"name": "a1"}))["status"] == "active"  # one user
    assert ok(send(anonymous, "post", "/v1/adapters/unload", {"name": "a1"}))["status"] == "available"
    make_client("second", can_approve=False)  # a team now: promotions need approval
    error(send(anonymous, "post", "/v1/adapters/load", {"name": "a1"}), 403, "activation_needs_approval")
    assert not Adapter.objects.get(name="a1").loaded


def test_a_released_reservation_takes_its_unpublished_folder_with_it(home, peft_adapter,
                                                                      django_capture_on_commit_callbacks):
    """QA: the GPU worker killed after the trainer wrote `adapters/<name>/` but before the registry
    published it left a complete folder no row lists: every resubmission and the resume its error
    offers answered 409 adapter_revision_conflict, restarts never removed it, and `kiln adapters
    delete` said adapter_not_found. The job's failure releases the name and the folder; its
    checkpoint (the resume point) stays."""
    import shutil

    from adapters.services import check_output_name_free

    job = _job(state="failed")
    adapter_reserve(name="k2", job=job)
    written = home / "adapters" / "k2"
    shutil.copytree(peft_adapter, written)  # what the trainer's atomic rename leaves before publication
    checkpoint = home / "adapters" / "k2-checkpoint-step-140.kiln-checkpoint"
    checkpoint.mkdir()
    with django_capture_on_commit_callbacks(execute=True):
        adapter_release(name="k2")  # the training kind's on_unsuccessful hook (training.hooks)
    assert not written.exists() and checkpoint.is_dir()
    assert not [p for p in (home / "adapters").iterdir() if p.name.startswith(".k2.")]  # nothing retired is left
    assert not Adapter.objects.filter(name="k2").exists()
    check_output_name_free("k2")  # a resubmission or the resume is admitted again
    assert _history("k2")[-1][:2] == ("writing", "failed")
