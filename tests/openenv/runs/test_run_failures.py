"""Every way a persisted run fails records a kiln.openenv-run-failure.v1 in the closed vocabulary with
its cause kept in the message and an actionable hint (reference-spec §4.12); an orphaned process
(its kiln serve gone) admits nothing; the CLI shows the whole typed failure and says when an
idempotency key answered the original run. No environment runs: rows are driven directly."""

from __future__ import annotations

import asyncio
import json
import os
import types

import pytest
import redis

from core.errors import KilnError
from core.jobs.models import Job, JobState
from openenv.collector import CollectionError
from openenv.collector.errors import DEFAULT_HINTS, NEW_ATTEMPT
from openenv.models import OpenEnvRun, RunState
from openenv.runs import jobs, services
from openenv.training import evaluation, follow, submission
from tests.openenv.runs.conftest import cli_through, post_run, rollout_body

pytestmark = pytest.mark.django_db


@pytest.fixture
def run(api, home):
    response = post_run(api, rollout_body("http://127.0.0.1:9"))
    assert response.status_code == 202, response.content
    return OpenEnvRun.objects.get(id=response.json()["run_id"])


def _job(**fields):
    values = {"state": JobState.FAILED, "error_code": "nan_loss", "error_message": "the loss was NaN at step 3",
              "kind": "training.grpo", "uuid": "7f6c"}
    return types.SimpleNamespace(**{**values, **fields})


def test_a_failed_training_job_fails_the_run_training_failed_keeping_its_code(run):
    follow._ended_unsuccessfully(run, _job(), "training")
    run.refresh_from_db()
    assert run.state == RunState.FAILED
    failure = run.failure
    assert (failure["code"], failure["stage"], failure["retryable"]) == ("training_failed", "training", False)
    assert failure["message"] == "training job 7f6c failed: nan_loss: the loss was NaN at step 3"
    assert failure["hint"] == "see the training job (kiln train status 7f6c) for the cause"


def test_a_failed_post_eval_fails_the_run_post_evaluation_failed(run):
    follow._ended_unsuccessfully(run, _job(kind="training.post_eval", error_code="eval_scorer_crashed",
                                           error_message="scorer exited 1"), "post_evaluation")
    run.refresh_from_db()
    assert (run.failure["code"], run.failure["stage"]) == ("post_evaluation_failed", "post_evaluation")
    assert run.failure["message"] == "post-evaluation job 7f6c failed: eval_scorer_crashed: scorer exited 1"
    assert "kiln eval status 7f6c" in run.failure["hint"]


def test_a_stored_failure_outside_the_vocabulary_is_normalized_at_the_one_write(run):
    services.run_fail(run, {"schema": "kiln.openenv-run-failure.v1", "code": "orchestration_failed",
                            "stage": "orchestration", "retryable": False, "message": "KeyError: 'x'", "hint": "",
                            "occurred_unix_ms": 5})
    run.refresh_from_db()
    assert run.failure == {"schema": "kiln.openenv-run-failure.v1", "code": "internal_error", "stage": "orchestration",
                           "retryable": False, "message": "orchestration_failed: KeyError: 'x'",
                           "hint": DEFAULT_HINTS["internal_error"], "occurred_unix_ms": 5}


def test_a_job_that_failed_with_its_own_code_fails_the_run_internal_error(run):
    job = Job.objects.get(id=run.job_id)
    Job.objects.filter(id=job.id).update(state=JobState.FAILED, error_code="openenv_run_state_changed",
                                         error_message="the run moved")
    job.refresh_from_db()
    services.run_job_unsuccessful(job)
    run.refresh_from_db()
    assert (run.failure["code"], run.failure["stage"]) == ("internal_error", "orchestration")
    assert run.failure["message"] == f"its openenv.run job {job.uuid} failed: openenv_run_state_changed: the run moved"
    assert run.failure["hint"] == "see the job (kiln jobs, or /ui/ Jobs) and the control worker's log"


def test_the_broker_going_away_mid_sampling_is_a_retryable_collection_failure(monkeypatch, db):
    def gone(body, timeout):
        raise redis.exceptions.ConnectionError("Error 111 connecting to unix socket. Connection refused.")

    monkeypatch.setattr("adapters.serving.sync_client.chat_completion_sync", gone)
    with pytest.raises(CollectionError) as info:
        asyncio.run(jobs._chat_post()({"messages": []}))
    failure = info.value.as_failure()
    assert (failure["code"], failure["stage"], failure["retryable"]) == ("collection_failed", "collection", True)
    assert failure["message"].startswith("the model service could not be reached mid-run: ConnectionError: Error 111")
    assert failure["hint"] == f"{jobs.BROKER_HINT}; then {NEW_ATTEMPT}"


def test_a_model_server_refusal_while_sampling_is_a_collection_failure(monkeypatch, db):
    def lost(body, timeout):
        raise KilnError("inference_worker_lost", "the GPU worker stopped", status=503, hint="kiln serve restarts it")

    monkeypatch.setattr("adapters.serving.sync_client.chat_completion_sync", lost)
    with pytest.raises(CollectionError) as info:
        asyncio.run(jobs._chat_post()({"messages": []}))
    failure = info.value.as_failure()
    assert (failure["code"], failure["retryable"]) == ("collection_failed", True)
    assert failure["message"] == "the model server answered inference_worker_lost: the GPU worker stopped"
    assert failure["hint"] == f"kiln serve restarts it; then {NEW_ATTEMPT}"


@pytest.mark.parametrize("error, retryable, hint", [
    (redis.exceptions.ConnectionError("Connection closed by server."), True, jobs.BROKER_HINT),
    (ValueError("bad"), False, "an unexpected error ended the run; the control worker's log has the traceback "
                               "(report it if it recurs)")])
def test_an_unclassified_error_ends_the_run_with_a_code_and_a_hint(run, error, retryable, hint):
    def body(ctx, run):
        raise error

    ctx = types.SimpleNamespace(payload={"run_id": str(run.id)})
    with pytest.raises(type(error)):
        jobs.run_stage_job(ctx, run, run.state, "orchestration", body)
    run.refresh_from_db()
    failure = run.failure
    assert (failure["code"], failure["stage"], failure["retryable"]) == ("internal_error", "orchestration", retryable)
    assert type(error).__name__ in failure["message"] and str(error) in failure["message"]
    assert failure["hint"] == (f"{hint}; then {NEW_ATTEMPT}" if retryable else hint)


def test_a_refused_training_submission_is_training_submission_failed(run, monkeypatch):
    services.run_transition(run, from_states=[run.state], state=RunState.SUBMITTING)
    monkeypatch.setattr(submission.contracts, "check_contract",
                        lambda contract, digest: {"effective_config": {"output_name": "x"}})
    monkeypatch.setattr(submission.contracts, "config_sources", lambda *a: {})
    monkeypatch.setattr(submission, "check_before_training", lambda run: None)
    monkeypatch.setattr(submission, "select_for_training", lambda groups: types.SimpleNamespace(
        groups=[{"g": 1}], indexes=[0], summary={"groups_submitted": 1}, warnings=[]))
    monkeypatch.setattr(submission, "training_data", lambda groups, indexes: None)

    def refuse(**kwargs):
        raise KilnError("training_queue_full", "the training queue holds 8 jobs", status=503,
                        hint="wait for a job to finish")

    monkeypatch.setattr("training.services.grpo_submit", refuse)
    with pytest.raises(KilnError) as info:
        submission.submit_training(run, [{"g": 1}])
    assert info.value.code == "training_submission_failed"
    run.refresh_from_db()
    failure = run.failure
    assert (failure["code"], failure["stage"], failure["retryable"], failure["http_status"]) == \
        ("training_submission_failed", "training_submission", True, 503)
    assert failure["message"] == "the training submission was refused: training_queue_full: the training queue holds 8 jobs"
    assert failure["hint"] == f"wait for a job to finish; then {NEW_ATTEMPT}"


def test_a_refused_environment_evaluation_enqueue_is_environment_evaluation_failed(run, monkeypatch):
    monkeypatch.setattr(evaluation, "plan_of", lambda run: object())
    monkeypatch.setattr(evaluation, "policies_of", lambda run: (None, None))

    def full(**kwargs):
        raise KilnError("control_queue_full", "the control queue is full", status=503, hint="")

    monkeypatch.setattr("core.jobs.services.job_submit", full)
    assert evaluation.environment_eval_start(run, from_states=[run.state]) is True
    run.refresh_from_db()
    failure = run.failure
    assert (failure["code"], failure["stage"], failure["retryable"]) == \
        ("environment_evaluation_failed", "environment_evaluation", True)
    assert failure["message"] == ("the environment evaluation could not be queued: control_queue_full: the control "
                                  "queue is full")
    assert failure["hint"] == f"{DEFAULT_HINTS['environment_evaluation_failed']}; then {NEW_ATTEMPT}"


# --- an orphaned process admits nothing ---------------------------------------------------------

def test_an_orphan_whose_kiln_serve_is_gone_admits_no_queued_run(api, home, monkeypatch):
    from core.jobs import worker_state

    monkeypatch.setattr(worker_state, "_boot_parent", os.getppid() + 1)  # its parent is no longer the one it had
    assert worker_state.orphaned() is True
    response = post_run(api, rollout_body("http://127.0.0.1:9"))
    assert response.status_code == 202
    queued = OpenEnvRun.objects.get(id=response.json()["run_id"])
    assert (queued.state, queued.admitted_at, queued.job_id) == (RunState.QUEUED, None, None)
    assert services.runs_admit() == []

    monkeypatch.setattr(worker_state, "_boot_parent", os.getppid())  # under its supervisor still
    assert worker_state.orphaned() is False
    assert [str(r.id) for r in services.runs_admit()] == [str(queued.id)]


# --- the CLI -------------------------------------------------------------------------------------

@pytest.fixture
def cli(api, monkeypatch):
    return cli_through(api, monkeypatch, lambda request: None)


def test_status_prints_the_whole_typed_failure(cli, run, capsys):
    services.run_fail(run, services.failure("environment_unavailable", "collection", "the WebSocket upgrade answered "
                                            "HTTP 503", retryable=True, http_status=503))
    OpenEnvRun.objects.filter(id=run.id).update(failure={**run.failure, "protocol_code": "CAPACITY_REACHED"})
    assert cli("status", str(run.id)) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("failure "))
    assert lines[at:at + 3] == [
        "failure   environment_unavailable at collection (retryable true): the WebSocket upgrade answered HTTP 503",
        "evidence  protocol code CAPACITY_REACHED, HTTP 503",
        f"hint      {DEFAULT_HINTS['environment_unavailable']}; then {NEW_ATTEMPT}"]


def test_the_same_idempotency_key_says_it_answered_the_original_run(cli, home, tmp_path, capsys):
    request = tmp_path / "r.json"
    request.write_text(json.dumps(rollout_body("http://127.0.0.1:9", idempotency_key="exp:1")))
    assert cli("start", "--request", str(request), "--json") == 0
    captured = capsys.readouterr()
    first = json.loads(captured.out)
    assert captured.err == ""
    original = OpenEnvRun.objects.get(id=first["run_id"])
    services.run_fail(original, services.failure("environment_unavailable", "discovery", "refused", retryable=True))

    assert cli("start", "--request", str(request), "--json") == 0
    captured = capsys.readouterr()
    again = json.loads(captured.out)
    assert (again["run_id"], again["state"]) == (first["run_id"], "failed")
    assert captured.err == (f"kiln: note: idempotency key 'exp:1' already names run {first['run_id']} (failed: "
                            f"environment_unavailable at discovery); this is that original run, not a new one: a new "
                            f"attempt needs a new idempotency_key\n")
    assert cli("start", "--request", str(request)) == 0
    captured = capsys.readouterr()
    assert "this is that original run" in captured.err and f"run       {first['run_id']}" in captured.out
    assert "hint      " in captured.out and "new idempotency_key" in captured.out
    assert OpenEnvRun.objects.count() == 1


def test_the_run_card_shows_the_protocol_code_and_http_status(run):
    from django.contrib.auth import get_user_model
    from django.test import Client

    services.run_fail(run, services.failure("environment_protocol_error", "collection", "the environment answered "
                                            "FACTORY_ERROR: broken", http_status=None))
    OpenEnvRun.objects.filter(id=run.id).update(failure={**run.failure, "protocol_code": "FACTORY_ERROR",
                                                         "http_status": 500})
    browser = Client()
    browser.force_login(get_user_model().objects.get(username="operator"))
    html = browser.get("/ui/training/openenv/?fragment=runs").content.decode()
    card = html[html.index(f'id="run-{run.id}"'):]
    card = card[:card.index("</article>")]
    assert ('<span class="run-failure-protocol">protocol code <code>FACTORY_ERROR</code></span>' in card
            and '<span class="run-failure-http">HTTP <code>500</code></span>' in card)
    assert "FACTORY_ERROR: broken" in card and DEFAULT_HINTS["environment_protocol_error"].split(";")[0] in card


def test_another_users_run_is_not_theirs_to_cancel(api, home):
    from django.contrib.auth import get_user_model

    response = post_run(api, rollout_body("http://127.0.0.1:9"))
    run = OpenEnvRun.objects.get(id=response.json()["run_id"])
    other = get_user_model().objects.create_user("someone-else", password="x" * 12)
    with pytest.raises(KilnError) as refused:
        services.run_cancel(run=run, user=other)
    assert (refused.value.code, refused.value.status) == ("openenv_run_cancel_forbidden", 403)
    run.refresh_from_db()
    assert not run.is_terminal and not run.cancel_requested
    assert services.run_cancel(run=run, user=run.submitted_by).state == RunState.CANCELLED


def test_a_failed_run_jobs_error_points_at_the_run_for_its_hint():
    """QA: the job page of a failed run said only "see the job's events", which repeat the message; the
    run's own status holds the stage and the hint. Codes the job table knows keep their own hint."""
    from core.jobs.error_hints import JOB_ERROR_HINTS, job_error

    failed = Job.objects.create(kind="openenv.run", queue="control", state=JobState.FAILED,
                                error_code="environment_unavailable", error_message="GET /health failed")
    assert job_error(failed)["hint"].startswith("the OpenEnv run's status holds the failure's stage")
    assert "kiln openenv status RUN_ID" in job_error(failed)["hint"]
    known = Job.objects.create(kind="openenv.run", queue="control", state=JobState.FAILED, error_code="zero_groups")
    assert job_error(known)["hint"] == JOB_ERROR_HINTS["zero_groups"]
    other = Job.objects.create(kind="test.steps", queue="gpu", state=JobState.FAILED, error_code="whatever")
    assert job_error(other)["hint"] == "see the job's events (kiln jobs show ID) for what happened"
