"""The post-eval job's branches that need no model (issue 12): a suite removed or changed after
admission ends the gate `error` with evidence and a receipt row, and the adapter stays inactive;
a demoted adapter leaves the registry and its folder becomes `<name>.failed`; the active adapter
is the most recently published one that is active."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from adapters.models import Adapter
from adapters.selectors import adapter_active
from adapters.services import adapter_demote, adapter_publish, adapter_reserve
from core.contracts.grpo_submission import PostEvalConfig
from core.jobs.models import Job
from core.jobs.runner import run_queued_jobs
from core.jobs.services import job_submit
from core.models import Receipt
from evaluations.suite_services import suite_store
from training.post_eval_jobs import post_eval_submit
from training.selectors import training_detail

pytestmark = pytest.mark.django_db

SUITE = {"name": "held", "scorer": {"type": "exact"},
         "examples": [{"id": "q1", "messages": [{"role": "user", "content": "What is 1 + 1?"}], "target": "2"}]}


@pytest.fixture
def home(settings, tmp_path):
    settings.KILN = replace(settings.KILN, home=tmp_path / "home")
    return tmp_path / "home"


def _published(name: str, home: Path, *, loaded: bool = False) -> Adapter:
    folder = home / "adapters" / name
    folder.mkdir(parents=True)
    (folder / "adapter_model.safetensors").write_bytes(b"weights")
    adapter_reserve(name=name)
    return adapter_publish(name=name, path=folder, content_sha256="sha256:" + "0" * 64, base_model_sha256="",
                           loaded=loaded)


def _training_job(name: str):
    job = job_submit(kind="test.steps", payload={"steps": 1}, title=f"training {name}")
    Job.objects.filter(id=job.id).update(kind="training.grpo", state="completed")
    return Job.objects.get(id=job.id)


def test_the_active_adapter_is_the_newest_active_one(home):
    assert adapter_active() is None  # the base model
    _published("a1", home, loaded=True)
    _published("a2", home)
    assert adapter_active().name == "a1"
    Adapter.objects.filter(name="a2").update(loaded=True)  # rows from before one-active-adapter
    assert adapter_active().name == "a2" and adapter_active(excluding="a2").name == "a1"


def test_a_suite_changed_after_admission_ends_the_gate_in_error(home, django_capture_on_commit_callbacks):
    suite = suite_store(body=SUITE)
    _published("prev", home, loaded=True)
    _published("cand", home)
    post_eval = PostEvalConfig.from_dict({"suite": "held", "min_accuracy": 0.5})
    with django_capture_on_commit_callbacks(execute=True):
        job = post_eval_submit(training_job=_training_job("cand"), adapter_name="cand", post_eval=post_eval,
                               suite_hash="sha256:" + "1" * 64, auto_load=True)
    assert job.payload["baseline_adapter"] == "prev"
    assert suite.suite_hash != job.payload["suite_hash"]
    with django_capture_on_commit_callbacks(execute=True):
        run_queued_jobs("control")
    job.refresh_from_db()
    assert job.state == "completed"
    assert job.result["gate_outcome"] == "error"
    [evidence] = job.result["post_eval_gate_evidence"]
    assert evidence["outcome"] == "error" and "removed or changed" in evidence["reason"]
    assert Adapter.objects.get(name="cand").loaded is False  # never served
    receipt = Receipt.objects.get(kind="post_eval_gate", subject="cand")
    assert receipt.body["evidence"] == evidence
    from core.metrics.models import MetricCounter  # GET /metrics counts the decision with its receipt

    assert MetricCounter.objects.get(family="kiln_gate_decisions_total",
                                     labels='gate="post_eval",outcome="error"').value == 1


def _gated_training_with_a_changed_suite(name: str, home: Path, capture, *, auto_load: bool):
    """A finished training job of `name` whose post-eval ran against a suite changed after admission
    (so it ends in error without a model)."""
    suite = suite_store(body=SUITE)
    _published(name, home)
    training = _training_job(name)
    with capture(execute=True):
        evaluation = post_eval_submit(training_job=training, adapter_name=name,
                                      post_eval=PostEvalConfig.from_dict({"suite": "held", "min_accuracy": 0.5}),
                                      suite_hash=suite.suite_hash + "x", auto_load=auto_load)
    Job.objects.filter(id=training.id).update(
        payload={"route": "/v1/train/grpo", "adapter_name": name, "snapshot_path": "/nonexistent",
                 "config": {"seed": "1", "output_name": name}, "training_data": {"source": "inline"},
                 "post_eval": {"suite": "held", "min_accuracy": 0.5}},
        result={"post_eval_job_id": str(evaluation.uuid)})
    with capture(execute=True):
        run_queued_jobs("control")
    return Job.objects.get(id=training.id)


def test_training_detail_reads_the_gate_from_its_post_eval_job(home, django_capture_on_commit_callbacks):
    training = _gated_training_with_a_changed_suite("cand2", home, django_capture_on_commit_callbacks,
                                                    auto_load=False)
    detail = training_detail(training)
    assert detail["gate_outcome"] == "error" and detail["post_eval_gate_evidence"][0]["outcome"] == "error"
    assert detail["states"]["evaluation"]["outcome"] == "error"
    assert detail["states"]["evaluation"]["eval_job_id"] is None  # the gate erred before it queued an evaluation
    assert detail["states"]["activation"] == {"active": False, "at": None, "deactivated_at": None, "demoted_to": None, "quarantined": False,
                                              "error": None, "activation_job_id": None, "promotion_id": None}


def test_a_demoted_adapter_is_renamed_failed_and_leaves_the_registry(home):
    adapter = _published("bad", home)
    moved = adapter_demote(name="bad")
    assert moved == home / "adapters" / "bad.failed" and (moved / "adapter_model.safetensors").is_file()
    assert not Path(adapter.path).exists() and not Adapter.objects.filter(name="bad").exists()
    again = _published("bad", home)  # the name can be trained again; a second demotion keeps both folders
    assert adapter_demote(name="bad") == home / "adapters" / "bad.failed.2" and not Path(again.path).exists()


def test_a_demoted_adapters_job_points_at_its_failed_folder(home, django_capture_on_commit_callbacks):
    training = _gated_training_with_a_changed_suite("cand4", home, django_capture_on_commit_callbacks,
                                                    auto_load=False)
    Job.objects.filter(id=training.id).update(result={**training.result,
                                                      "adapter_path": str(home / "adapters" / "cand4")})
    training.refresh_from_db()
    moved = adapter_demote(name="cand4")
    evaluation = Job.objects.get(uuid=training.result["post_eval_job_id"])
    Job.objects.filter(id=evaluation.id).update(result={**evaluation.result, "demoted_to": str(moved)})
    detail = training_detail(training)
    assert detail["adapter_path"] == str(moved) and Path(detail["adapter_path"]).is_dir()
    assert detail["states"]["activation"]["demoted_to"] == str(moved)


def test_the_training_job_page_shows_the_three_states_and_the_gate(home, django_capture_on_commit_callbacks):
    from django.test import Client

    from core.accounts.services import user_create

    training = _gated_training_with_a_changed_suite("cand3", home, django_capture_on_commit_callbacks,
                                                    auto_load=True)
    from django.utils import timezone

    from core.jobs.models import Job

    finished = timezone.now().replace(microsecond=0)
    Job.objects.filter(id=training.id).update(finished_at=finished)
    client = Client()
    client.force_login(user_create(username="looker", password="long-enough-pw"))
    html = client.get(f"/ui/jobs/{training.uuid}/").content.decode()
    assert 'id="training-states"' in html and 'id="state-evaluation"' in html
    assert "gate <strong>error</strong>" in html
    assert 'id="gate-evidence" data-outcome="error"' in html
    assert "not active (gate error)" in html
    # QA: these times read "Dec. 6, 2026, 10:58 a.m."; every other time on the pages is ISO UTC
    state = html.split('id="state-training"', 1)[1].split("</dd>", 1)[0]
    assert f'<time datetime="{finished.isoformat()}"' in state
    assert finished.strftime("%Y-%m-%d %H:%M:%S") in state and "a.m." not in html and "p.m." not in html


def test_a_post_eval_that_died_before_deciding_is_the_gates_error(home, django_capture_on_commit_callbacks):
    # kill -9 of the control worker while the post-eval runs: the eval job ends failed
    # (job_interrupted) with no gate result; the training status said gate_outcome null for ever.
    suite_store(body=SUITE)
    _published("cand3", home)
    training = _training_job("cand3")
    with django_capture_on_commit_callbacks(execute=True):
        evaluation = post_eval_submit(training_job=training, adapter_name="cand3",
                                      post_eval=PostEvalConfig.from_dict({"suite": "held", "min_accuracy": 0.5}),
                                      suite_hash="sha256:" + "2" * 64, auto_load=True)
    Job.objects.filter(id=training.id).update(
        payload={"route": "/v1/train/grpo", "adapter_name": "cand3", "snapshot_path": "/nonexistent",
                 "config": {"seed": "1", "output_name": "cand3"}, "training_data": {"source": "inline"},
                 "post_eval": {"suite": "held", "min_accuracy": 0.5}},
        result={"post_eval_job_id": str(evaluation.uuid)})
    assert training_detail(Job.objects.get(id=training.id))["gate_outcome"] is None  # queued: still to decide
    Job.objects.filter(id=evaluation.id).update(state="failed", error_code="job_interrupted",
                                                error_message="the worker shut down while the job ran")
    detail = training_detail(Job.objects.get(id=training.id))
    assert detail["gate_outcome"] == "error"
    assert "ended failed before the gate decided (job_interrupted: " in detail["post_eval_verdict"]
    # the job's three states say the same (QA: states.evaluation.outcome stayed null)
    evaluation_state = detail["states"]["evaluation"]
    assert (evaluation_state["state"], evaluation_state["outcome"]) == ("failed", "error")
    assert evaluation_state["reason"] == detail["post_eval_verdict"]
    assert Adapter.objects.get(name="cand3").loaded is False


def test_a_deleted_eval_job_is_no_longer_linked(home):
    from django.utils import timezone

    def row(kind, result):
        job = job_submit(kind="test.steps", payload={"steps": 1}, title=kind)
        Job.objects.filter(id=job.id).update(kind=kind, state="completed", result=result)
        return Job.objects.get(id=job.id)

    evaluation = row("eval.run", {})
    post = row("training.post_eval", {"linked_eval_job_ids": [str(evaluation.uuid)], "gate_outcome": "kept"})
    training = _training_job("lnk")
    Job.objects.filter(id=training.id).update(
        payload={"route": "/v1/train/grpo", "adapter_name": "lnk", "snapshot_path": "/nonexistent",
                 "config": {"seed": "1", "output_name": "lnk"}, "training_data": {"source": "inline"}},
        result={"post_eval_job_id": str(post.uuid)})
    training.refresh_from_db()
    assert training_detail(training)["linked_eval_job_ids"] == [str(evaluation.uuid)]
    Job.objects.filter(id=evaluation.id).update(deleted_at=timezone.now())  # DELETE /v1/eval/jobs/{id}
    assert training_detail(training)["linked_eval_job_ids"] == []


@pytest.mark.django_db
def test_a_deleted_gate_evaluation_leaves_no_pointer_to_it():
    """states.evaluation.eval_job_id named an eval job deleted since (404 everywhere), while
    linked_eval_job_ids had already dropped it."""
    from django.utils import timezone

    from training.selectors import post_eval_state

    evaluation = Job.objects.create(kind="evaluation.run", queue="infer", state="completed")
    post_eval = Job.objects.create(kind="training.post_eval", queue="control", state="completed",
                                   result={"linked_eval_job_ids": [str(evaluation.uuid)], "gate_outcome": "kept"})
    training = Job.objects.create(kind="training.grpo", queue="gpu", state="completed",
                                  result={"post_eval_job_id": str(post_eval.uuid)})
    assert post_eval_state(training)["evaluation"]["eval_job_id"] == str(evaluation.uuid)
    Job.objects.filter(id=evaluation.id).update(deleted_at=timezone.now())
    state = post_eval_state(training)["evaluation"]
    assert state["eval_job_id"] is None and state["job_id"] == str(post_eval.uuid)


def test_a_cancelled_gate_whose_evaluation_is_publishing_ends_cancelled_not_failed():
    """The gate's evaluation may be past its point of no return (publishing results.json) when the gate
    is cancelled: that evaluation's cancel is refused (409), and the gate still stops as cancelled."""
    from core.jobs.runner import JobCancelled, JobContext
    from training.post_eval_jobs import _wait_for

    evaluation = job_submit(kind="test.steps", payload={})
    Job.objects.filter(id=evaluation.id).update(state="running", publishing=True)
    gate = job_submit(kind="test.control_steps", payload={})
    Job.objects.filter(id=gate.id).update(state="running", cancel_requested=True)
    with pytest.raises(JobCancelled):
        _wait_for(JobContext(Job.objects.get(id=gate.id)), evaluation)
    evaluation.refresh_from_db()
    assert (evaluation.state, evaluation.cancel_requested) == ("running", False)  # it publishes its results
