"""POST/GET/DELETE /v1/openenv/runs without executing anything (reference-spec §1.6, §4.9-4.10).

Admission comes before discovery, so these runs name a loopback port nobody listens on: no
request here contacts an environment. Execution, downloads and the CLI are in the sibling files.
"""

from __future__ import annotations

import pytest

from core.jobs.models import Job, JobState
from core.jobs.services import job_claim_next
from core.jobs.worker_state import recover_queues
from openenv.models import OpenEnvRun
from openenv.runs.request import normalize, request_digest
from openenv.runs.services import runs_restore
from tests.openenv.runs.conftest import error_of, metric, post_run, rollout_body

pytestmark = [pytest.mark.django_db, pytest.mark.timeout(60)]

URL = "http://127.0.0.1:9"


def test_a_new_run_is_202_queued_and_admitted_in_order(api, home, bounds):
    bounds(max_active_runs=1)
    first = post_run(api, rollout_body(URL))
    second = post_run(api, rollout_body(URL, seed_start=7))
    third = post_run(api, rollout_body(URL, seed_start=9))
    assert [r.status_code for r in (first, second, third)] == [202, 202, 202]
    a, b, c = (r.json() for r in (first, second, third))
    assert a["schema"] == "kiln.openenv-run.v5" and a["kind"] == "rollout"
    assert a["state"] == "discovering" and a["stage"] == "discovery" and a["job_id"]
    assert [b["state"], c["state"]] == ["queued", "queued"]
    assert [a["admission"]["sequence"] + 1, a["admission"]["sequence"] + 2] == \
        [b["admission"]["sequence"], c["admission"]["sequence"]]
    assert "queue_position" not in a["admission"] and "admitted_unix_ms" in a["admission"]
    assert [b["admission"]["queue_position"], c["admission"]["queue_position"]] == [1, 2]
    assert b["admission"]["max_active_runs"] == 1 and "admitted_unix_ms" not in b["admission"]
    assert b["progress"] == {"groups_completed": 0, "groups_total": 2, "rollouts_completed": 0,
                             "rollouts_total": 4}
    # The normalized request: defaults applied, URL normalized, numbers typed.
    request = a["request"]
    assert request["environment_urls"] == [URL] and request["adapter"] == "base" and request["thinking"] is True
    assert request["temperature"] == 1.0 and request["capacity_wait_seconds"] == 5.0
    assert request["max_action_tokens"] == 256 and request["protocol_error_reward"] == -1.0
    # Only the admitted run has a job; queued runs hold nothing.
    assert Job.objects.filter(kind="openenv.run").count() == 1
    listing = api.get("/v1/openenv/runs").json()
    assert listing["schema"] == "kiln.openenv-run-list.v5"
    assert [r["run_id"] for r in listing["runs"]] == [c["run_id"], b["run_id"], a["run_id"]]  # newest first
    # Cancelling the active one admits the next in sequence order.
    cancelled = api.delete(f"/v1/openenv/runs/{a['run_id']}").json()
    assert cancelled["state"] == "cancelled"  # its job had not started: cancelled at once
    assert api.get(f"/v1/openenv/runs/{b['run_id']}").json()["state"] == "discovering"
    assert api.get(f"/v1/openenv/runs/{c['run_id']}").json()["admission"]["queue_position"] == 1


def test_idempotent_retry_is_200_and_a_changed_reuse_is_409(api, home):
    body = rollout_body(URL, idempotency_key="experiment:counter:17")
    created = post_run(api, body)
    assert created.status_code == 202
    # The same request spelled differently (alias, explicit defaults, an int temperature) is the same.
    again = dict(body, temperature=1, thinking=True, adapter="base")
    again["environments"] = [URL + "/"]
    del again["environment_urls"]
    retry = post_run(api, again)
    assert retry.status_code == 200, retry.content
    assert retry.json()["run_id"] == created.json()["run_id"]
    assert retry.json()["idempotency_key"] == "experiment:counter:17"
    error = error_of(post_run(api, dict(body, groups=3)), 409, "openenv_run_idempotency_conflict")
    assert created.json()["run_id"] in error["message"]
    assert OpenEnvRun.objects.count() == 1
    # GET /metrics: one accepted, one answered from its key (the refused reuse counts as neither)
    assert metric(api, "kiln_openenv_runs_total", status="accepted") == 1
    assert metric(api, "kiln_openenv_runs_total", status="idempotent_replay") == 1
    assert metric(api, "kiln_openenv_tracked_runs", state=OpenEnvRun.objects.get().state) == 1
    assert "experiment" not in api.get("/metrics").content.decode()  # keys are never labels


def test_the_tracked_map_full_is_503_and_terminal_runs_are_evicted(api, home, bounds):
    bounds(max_tracked_runs=2, max_active_runs=1)
    first = post_run(api, rollout_body(URL)).json()
    post_run(api, rollout_body(URL))
    error = error_of(post_run(api, rollout_body(URL)), 503, "openenv_run_capacity_full")
    assert "max_tracked_runs 2" in error["message"]
    assert OpenEnvRun.objects.count() == 2
    api.delete(f"/v1/openenv/runs/{first['run_id']}")  # now terminal: evicted for the next one
    assert post_run(api, rollout_body(URL)).status_code == 202
    assert OpenEnvRun.objects.count() == 2 and not OpenEnvRun.objects.filter(id=first["run_id"]).exists()


@pytest.mark.parametrize(("change", "field"), [
    ({"surprise": 1}, "surprise"),
    ({"environment_eval": {"groups": 20}}, "environment_eval"),
    ({"output_adapter": "counter-agent"}, "output_adapter"),
    ({"training_config": {}}, "training_config"),
    ({"post_eval": {"suite": "s"}}, "post_eval"),
    ({"kind": "explore"}, "kind"),
    ({"groups": 0}, "groups"),
    ({"groups": True}, "groups"),
    ({"temperature": "hot"}, "temperature"),
    ({"idempotency_key": "has space"}, "idempotency_key"),
    ({"idempotency_key": "k" * 129}, "idempotency_key"),
    ({"environment_urls": []}, "environment_urls"),
    ({"environment_urls": ["http://user:pw@127.0.0.1:9"]}, "environment_urls[0]"),
    ({"environment_urls": ["http://127.0.0.1:9/?q=1"]}, "environment_urls[0]"),
    ({"credential_ids": ["has space"]}, "credential_ids[0]"),
    ({"credential_ids": [None, None]}, "credential_ids"),
    ({"environment_reset_options": [{"a": 1}]}, "environment_reset_options"),
    ({"thinking": False, "thinking_budget_tokens": 8}, "thinking_budget_tokens"),
    ({"thinking_budget_tokens": 256}, "thinking_budget_tokens"),
    ({"environment_urls": [URL, "http://127.0.0.1:10"], "groups": 1}, "groups"),
])
def test_invalid_requests_are_400_naming_the_field(api, home, change, field):
    error = error_of(post_run(api, rollout_body(URL, **change)), 400, "openenv_invalid_request")
    assert error["message"].startswith(f"request: {field}"), error
    assert not OpenEnvRun.objects.exists() and not Job.objects.exists()


def test_train_is_validated_then_preflighted(api, home, settings):
    import dataclasses

    settings.KILN = dataclasses.replace(settings.KILN, model_path=None)
    train = {"kind": "train", "environment_urls": [URL], "output_adapter": "counter-agent", "groups": 8,
             "environment_eval": {"groups": 20, "group_size": 1, "gate": {"min_mean_improvement": 0.05}}}
    # Without model weights the preflight refuses with the training code (nothing is recorded), with
    # environment_eval (now run after training: tests/openenv/training/test_environment_eval_runs.py) or not.
    error_of(post_run(api, train), 503, "mock_mode")
    error_of(post_run(api, dict(train, environment_eval=None)), 503, "mock_mode")
    # The rules of train still apply first.
    missing = error_of(post_run(api, dict(train, output_adapter=None)), 400, "openenv_invalid_request")
    assert missing["message"].startswith("request: output_adapter")
    overlap = dict(train, environment_eval={"groups": 20, "seed_start": 3})
    assert error_of(post_run(api, overlap), 400, "openenv_invalid_request")["message"].startswith(
        "request: environment_eval.seed_start")
    small_gate = dict(train, environment_eval={"groups": 5, "gate": {}})
    assert error_of(post_run(api, small_gate), 400, "openenv_invalid_request")["message"].startswith(
        "request: environment_eval.groups")
    same = dict(train, adapter="counter-agent")
    assert error_of(post_run(api, same), 400, "openenv_invalid_request")["message"].startswith(
        "request: environment_eval")
    assert not OpenEnvRun.objects.exists()


def test_server_rules_remote_credentials_adapters_and_disabled(api, home, settings):
    error_of(post_run(api, rollout_body("http://10.1.2.3:8990")), 403, "openenv_remote_environment_refused")
    error_of(post_run(api, rollout_body(URL, credential_ids=["prod"])), 400, "openenv_credential_not_found")
    # The preflight's and the adapter routes' codes, not openenv_invalid_request (spec §1.6).
    error = error_of(post_run(api, rollout_body(URL, adapter="nope")), 404, "adapter_not_found")
    assert "no published adapter named 'nope'" in error["message"]
    error_of(post_run(api, rollout_body(URL, adapter="../evil")), 400, "invalid_adapter_name")
    error_of(api.get("/v1/openenv/runs/not-a-uuid"), 404, "openenv_run_not_found")
    error_of(api.delete("/v1/openenv/runs/00000000-0000-0000-0000-000000000000"), 404, "openenv_run_not_found")
    from dataclasses import replace
    settings.KILN = replace(settings.KILN, openenv_enabled=False)
    for response in (api.get("/v1/openenv/runs"), post_run(api, rollout_body(URL)),
                     api.post("/v1/openenv/inspect", data="{}", content_type="application/json")):
        error_of(response, 404, "openenv_disabled")
    assert not OpenEnvRun.objects.exists()


def test_the_maintenance_profile_refuses_a_run_before_it_is_recorded(api, home, settings):
    """Spec audit: a run was admitted (202), then discovered, reset and failed at its first action with
    collection_failed; chat and evaluation were refused at once. Training runs too: they collect first."""
    from dataclasses import replace

    accepted = post_run(api, rollout_body(URL, idempotency_key="before:maintenance"))
    assert accepted.status_code == 202
    settings.KILN = replace(settings.KILN, serving_profile="maintenance")
    retried = post_run(api, rollout_body(URL, idempotency_key="before:maintenance"))  # still its own run
    assert retried.status_code == 200 and retried.json()["run_id"] == accepted.json()["run_id"]
    OpenEnvRun.objects.all().delete()
    Job.objects.all().delete()
    for body in (rollout_body(URL), rollout_body(URL, kind="train", output_adapter="counter-agent")):
        error = error_of(post_run(api, body), 503, "inference_disabled_by_profile")
        assert error["message"] == "the maintenance serving profile refuses inference"
        assert "KILN_SERVER_SERVING_PROFILE=stable" in error["hint"]
    assert not OpenEnvRun.objects.exists() and not Job.objects.exists()


def test_a_terminal_run_is_not_cancellable(api, home):
    run = post_run(api, rollout_body(URL)).json()
    assert api.delete(f"/v1/openenv/runs/{run['run_id']}").json()["state"] == "cancelled"
    error_of(api.delete(f"/v1/openenv/runs/{run['run_id']}"), 409, "openenv_run_not_cancellable")


def test_restart_fails_the_running_run_and_resumes_the_queued_ones_in_order(api, home, bounds):
    bounds(max_active_runs=1)
    running, waiting, last = (post_run(api, rollout_body(URL, seed_start=s)).json() for s in (0, 50, 90))
    # The first run's job started on a worker that then died mid-collection.
    job = job_claim_next(queue="control", worker_id="gone-host:4242:deadbeef")
    assert str(job.uuid) == running["job_id"]
    OpenEnvRun.objects.filter(id=running["run_id"]).update(state="collecting", stage="collection",
                                                           progress={"rollouts_completed": 1})
    # The restart: the job system recovers its rows, then the control worker restores runs.
    recover_queues(["control"])
    assert Job.objects.get(uuid=job.uuid).error_code == "job_interrupted"
    outcome = runs_restore(worker_id="new-host:1:cafe")
    assert outcome == {"interrupted": [running["run_id"]], "admitted": [waiting["run_id"]]}
    failed = api.get(f"/v1/openenv/runs/{running['run_id']}").json()
    assert failed["state"] == "failed" and failed["stage"] == "restoration"
    failure = failed["failure"]
    assert failure["schema"] == "kiln.openenv-run-failure.v1"
    assert (failure["code"], failure["stage"], failure["retryable"]) == ("run_interrupted", "restoration", True)
    assert "collecting" in failure["message"]
    assert metric(api, "kiln_openenv_run_failures_total", stage="restoration", code="run_interrupted",
                  retryable="true") == 1
    resumed = api.get(f"/v1/openenv/runs/{waiting['run_id']}").json()
    assert resumed["state"] == "discovering" and resumed["job_id"]
    assert Job.objects.get(uuid=resumed["job_id"]).state == JobState.QUEUED
    still = api.get(f"/v1/openenv/runs/{last['run_id']}").json()
    assert still["state"] == "queued" and still["admission"]["queue_position"] == 1
    # A second restart: the admitted run whose job never started is interrupted too; the queued one resumes.
    outcome = runs_restore(worker_id="newer-host:1:beef")
    assert outcome == {"interrupted": [waiting["run_id"]], "admitted": [last["run_id"]]}
    assert Job.objects.get(uuid=resumed["job_id"]).state == JobState.CANCELLED


def test_the_digest_is_the_normalized_request():
    a = normalize(rollout_body(URL, temperature=1))
    b = normalize(dict(rollout_body("127.0.0.1:9"), temperature=1.0, max_steps=4))
    assert a == b and request_digest(a) == request_digest(b)
    assert request_digest(a) != request_digest(normalize(rollout_body(URL, seed_start=2**62)))


def test_a_control_worker_that_is_shutting_down_admits_no_queued_run(api, home, bounds, monkeypatch):
    # Before: a run that ended during a planned shutdown admitted the next queued one, which the
    # next boot then failed `run_interrupted`; a never-admitted run resumes after the restart.
    from core.jobs import runner
    from openenv.runs.services import runs_admit

    bounds(max_active_runs=1)
    first = post_run(api, rollout_body(URL)).json()
    second = post_run(api, rollout_body(URL, seed_start=7)).json()
    monkeypatch.setattr(runner._shutting_down, "is_set", lambda: True)
    assert api.delete(f"/v1/openenv/runs/{first['run_id']}").json()["state"] == "cancelled"
    assert runs_admit() == []
    waiting = OpenEnvRun.objects.get(id=second["run_id"])
    assert waiting.state == "queued" and waiting.admitted_at is None
    monkeypatch.undo()
    assert [str(r.id) for r in runs_admit()] == [second["run_id"]]


@pytest.mark.parametrize(("route", "code"), [("/v1/openenv/runs", "openenv_invalid_request"),
                                             ("/v1/openenv/training/preflight", "training_invalid_request")])
@pytest.mark.parametrize("body", ["[]", "3", '"run"', "not json"])
def test_a_body_that_is_not_an_object_gets_the_routes_own_400(api, home, route, code, body):
    response = api.post(route, data=body, content_type="application/json")
    assert response.status_code == 400, response.content
    error = error_of(response, 400, code)
    assert set(error) == {"code", "message", "hint"} and error["message"].startswith("request: ")
    assert not OpenEnvRun.objects.exists()
