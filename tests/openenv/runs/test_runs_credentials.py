"""Server-side credentials for protected OpenEnv deployments (reference-spec §4.13, guide: "Protected
environments"): `[openenv.credentials.<id>]` names an exact origin and the variable that holds the
bearer token; requests carry only the handle (`credential_ids`, `credential_id`).

Against a real `openenv==0.10.0` server behind a bearer check (tests/openenv/interop_env/
kiln_protected_env.py): a run with the handle collects (the token on /health, discovery and the
WebSocket upgrade, as the server's log shows nothing refused), records only `authentication:
bearer`, and no token reaches the run's record, artifacts or the database; without the handle the
same run fails at discovery with the server's 401; an unknown handle, one bound to another origin,
or a token variable unset in the worker each fail with their own code, and the inspect route takes
the handle too."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from core.jobs.runner import run_queued_jobs
from openenv.models import OpenEnvRun
from tests.openenv.runs.conftest import error_of, metric, post_run, rollout_body

pytestmark = [pytest.mark.integration, pytest.mark.django_db, pytest.mark.timeout(600)]

TOKEN = "kiln-test-bearer-5c1f0e9a"
VARIABLE = "KILN_TEST_ENV_TOKEN"
PROTECTED = Path(__file__).resolve().parents[1] / "interop_env" / "kiln_protected_env.py"


@pytest.fixture(scope="module")
def protected(tmp_path_factory):
    from tests.openenv.real_server import RealServer, openenv_python

    server = RealServer(openenv_python(), tmp_path_factory.mktemp("protected-env"), max_sessions=8,
                        module_source=PROTECTED)
    server.env["KILN_INTEROP_TOKEN"] = TOKEN
    server.health_headers = {"Authorization": f"Bearer {TOKEN}"}
    with server:
        yield server


@pytest.fixture
def configured(settings, protected, monkeypatch):
    """The handle `team` for the protected server's origin, its token in this process's environment."""
    settings.KILN = replace(settings.KILN, openenv_credentials={
        "team": {"origin": protected.url, "bearer_token_env": VARIABLE},
        "elsewhere": {"origin": "https://env.example:8443", "bearer_token_env": VARIABLE}})
    monkeypatch.setenv(VARIABLE, TOKEN)


def _status(api, run_id):
    return api.get(f"/v1/openenv/runs/{run_id}").json()


def test_a_run_with_the_servers_handle_collects_and_no_token_is_kept(api, home, protected, configured, policies):
    refusals = protected.log_tail(10_000).count("refused")
    run = post_run(api, rollout_body(protected.url, credential_ids=["team"])).json()
    assert run["request"]["credential_ids"] == ["team"]
    run_queued_jobs("control")
    done = _status(api, run["run_id"])
    assert done["state"] == "rollout_ready", done
    [identity] = done["environments"]
    assert identity["authentication"] == "bearer" and identity["metadata"]["name"] == "kiln_counter"
    assert done["rollout_stats"]["done_count"] + done["rollout_stats"]["max_steps_count"] == 4
    folder = home / "adapters" / ".openenv" / "runs" / run["run_id"]
    for path in folder.rglob("*"):
        if path.is_file():
            assert TOKEN.encode() not in path.read_bytes(), path
    row = OpenEnvRun.objects.get(id=run["run_id"])
    assert TOKEN not in json.dumps([row.request, row.environments, row.artifacts], default=str)
    assert VARIABLE not in json.dumps(done)
    assert protected.log_tail(10_000).count("refused") == refusals  # the token went everywhere it had to
    # GET /metrics counts the protected run once per credentialed environment, naming neither
    assert metric(api, "kiln_openenv_authenticated_operations_total", operation="run") == 1
    assert metric(api, "kiln_openenv_authenticated_operations_total", operation="inspect") == 0
    exposition = api.get("/metrics").content.decode()
    assert TOKEN not in exposition and "team" not in exposition and protected.url not in exposition


def test_without_the_handle_the_same_run_fails_at_discovery_with_the_servers_refusal(api, home, protected,
                                                                                   configured, policies):
    run = post_run(api, rollout_body(protected.url)).json()
    run_queued_jobs("control")
    failed = _status(api, run["run_id"])
    assert failed["state"] == "failed" and failed["failure"]["stage"] == "discovery", failed
    assert "401" in failed["failure"]["message"] or "401" in json.dumps(failed["failure"])
    # a missing credential is a configuration problem to fix (not retryable), and the hint says how
    assert failed["failure"]["code"] == "persisted_contract_invalid" and not failed["failure"]["retryable"]
    assert "requires credentials" in failed["failure"]["message"] and "credential_ids" in failed["failure"]["hint"]
    assert "refused http /health" in protected.log_tail(200)


def test_a_bad_handle_is_refused_at_admission_and_spends_no_episode(api, home, protected, configured):
    error_of(post_run(api, rollout_body(protected.url, credential_ids=["nobody"])), 400,
             "openenv_credential_not_found")
    wrong = error_of(post_run(api, rollout_body(protected.url, credential_ids=["elsewhere"])), 400,
                     "openenv_credential_invalid")
    assert "https://env.example:8443" in wrong["message"]
    assert OpenEnvRun.objects.count() == 0


def test_a_token_variable_unset_in_the_worker_fails_the_run_before_connecting(api, home, protected, configured,
                                                                            policies, monkeypatch):
    run = post_run(api, rollout_body(protected.url, credential_ids=["team"])).json()
    monkeypatch.delenv(VARIABLE)
    run_queued_jobs("control")
    failed = _status(api, run["run_id"])
    assert failed["state"] == "failed", failed
    assert failed["failure"]["code"] == "persisted_contract_invalid" and VARIABLE in failed["failure"]["message"]
    assert not failed.get("environments")


def test_the_inspect_route_takes_the_handle(api, protected, configured):
    response = api.post("/v1/openenv/inspect", data=json.dumps({"url": protected.url, "credential_id": "team"}),
                        content_type="application/json")
    assert response.status_code == 200, response.content
    [inspection] = response.json()["environments"]
    assert inspection["identity"]["authentication"] == "bearer"
    refused = api.post("/v1/openenv/inspect", data=json.dumps({"url": protected.url}),
                       content_type="application/json")
    assert refused.status_code == 502, refused.content


def test_a_dash_is_a_public_slot_as_the_guide_says(api, home, protected, configured):
    # "Align server credential_ids ... with URLs; use - for a public slot": stored as null, not a handle
    run = post_run(api, rollout_body(protected.url, credential_ids=["-"], idempotency_key="dash-1")).json()
    assert run["request"]["credential_ids"] == [None]
    retry = post_run(api, rollout_body(protected.url, credential_ids=[None], idempotency_key="dash-1"))
    assert retry.status_code == 200 and retry.json()["run_id"] == run["run_id"]  # the same request
    # inspect: "-" sends no token, so the protected server refuses (502), it is not an unknown handle (400)
    body = {"environment_urls": [protected.url, protected.url], "credential_ids": ["team", "-"]}
    refused = api.post("/v1/openenv/inspect", data=json.dumps(body), content_type="application/json")
    assert refused.status_code == 502 and refused.json()["error"]["code"] == "openenv_inspection_failed"
    body["credential_ids"] = ["team", "team"]
    assert api.post("/v1/openenv/inspect", data=json.dumps(body), content_type="application/json").status_code == 200
    # inspections that sent the credential: one environment of the first, both of the second
    assert metric(api, "kiln_openenv_authenticated_operations_total", operation="inspect") == 3
