"""Training → OpenEnv through the test client: the run form, Inspect, the run cards and cancel.

Submissions go through the same steps as POST /v1/openenv/runs (kiln_project/ui/openenv_views.py
run_submit_checked: normalize, the server's checks, openenv.runs.services.run_submit): a recorded
run whose stored request is the posted body normalized, or an error shown next to the form and
nothing recorded. Cards read `kiln.openenv-run.v5` documents; later states are set on the rows
directly (collection against a real server is tests/ui/test_openenv_browser.py and
tests/openenv/runs/).
"""

from __future__ import annotations

import json
import re
from html import unescape
from urllib.parse import urlencode

import pytest
from django.http import QueryDict
from django.test import Client
from django.utils import timezone

from core.jobs.models import JobState
from openenv.models import OpenEnvRun
from openenv.runs.request import FIELDS, normalize
from openenv.runs.services import run_submit

pytestmark = pytest.mark.django_db

PAGE = "/ui/training/openenv/"
URL_A, URL_B = "http://127.0.0.1:8990", "http://localhost:8991/"

# Each request field and the form inputs that carry it.
FORM_NAMES = {
    "kind": ["kind"], "idempotency_key": ["idempotency_key"], "environment_urls": ["environment_url"],
    "environments": ["environment_url"], "credential_ids": ["credential_id"], "adapter": ["adapter"],
    "groups": ["groups"], "group_size": ["group_size"], "seed_start": ["seed_start"],
    "reset_options": ["reset_options"], "environment_reset_options": ["environment_reset_options"],
    "max_steps": ["max_steps"], "concurrency": ["concurrency"], "max_action_tokens": ["max_action_tokens"],
    "temperature": ["temperature"], "thinking": ["thinking"], "thinking_budget_tokens": ["thinking_budget_tokens"],
    "protocol_error_reward": ["protocol_error_reward"], "max_recoverable_errors": ["max_recoverable_errors"],
    "capacity_wait_seconds": ["capacity_wait_seconds"], "output_adapter": ["output_adapter"],
    "training_config": ["tc_lora_rank", "tc_learning_rate", "tc_kl_coeff", "tc_checkpoint_interval", "tc_seed",
                        "training_config_json"],
    "auto_load": ["auto_load"],
    "post_eval": ["post_eval_suite", "post_eval_data_scope", "post_eval_min_accuracy", "post_eval_include_baseline"],
    "environment_eval": ["environment_eval", "ee_groups", "ee_group_size", "ee_seed_start", "gate",
                         "gate_min_mean_return", "gate_min_mean_improvement"],
}


def _key(html: str) -> str:
    return re.search(r'name="idempotency_key" id="id_idempotency_key" value="([^"]+)"', html).group(1)


def _form(**fields) -> dict:
    """A rollout form as the browser posts it (blank text fields included, checkboxes only when on)."""
    data = {"kind": "rollout", "idempotency_key": "ui:test-1", "adapter": "base", "environment_url": [URL_A],
            "credential_id": [""], "environment_reset_options": [""], "row_id": ["0"], "reset_options": "",
            "groups": "2", "group_size": "2", "seed_start": "100", "max_steps": "4", "concurrency": "2",
            "max_action_tokens": "256", "temperature": "1.0", "thinking": "on", "thinking_budget_tokens": "",
            "protocol_error_reward": "-1.0", "max_recoverable_errors": "3", "capacity_wait_seconds": "5",
            "output_adapter": "", "auto_load": "on", "training_config_json": "", "tc_lora_rank": "",
            "tc_learning_rate": "", "tc_kl_coeff": "", "tc_checkpoint_interval": "", "tc_seed": "",
            "post_eval_suite": "", "post_eval_data_scope": "held-out", "post_eval_min_accuracy": "",
            "ee_groups": "20", "ee_group_size": "1", "ee_seed_start": "", "gate_min_mean_return": "",
            "gate_min_mean_improvement": ""}
    data.update(fields)
    return data


def _error(response) -> tuple[str, str]:
    html = unescape(response.content.decode())
    code = re.search(r'id="form-error-code">([^<]+)<', html).group(1)
    message = re.search(r'id="form-error-message">([^<]+)<', html).group(1)
    return code, message


def test_the_form_renders_every_request_field_and_a_fresh_key_per_rendering(operator_client):
    first = operator_client.get(PAGE)
    assert first.status_code == 200
    html = first.content.decode()
    for field in FIELDS:
        for name in FORM_NAMES[field]:
            assert f'name="{name}"' in html, (field, name)
    assert 'value="rollout"' in html and 'value="train"' in html
    assert re.search(r'name="thinking" id="id_thinking" checked', html), "thinking is on by default"
    assert 'hx-post="/ui/training/openenv/inspect/"' in html and 'id="add-environment"' in html
    assert "No OpenEnv runs yet." in html and 'id="openenv-runs"' in html and "hx-trigger" not in \
        html[html.index('id="openenv-runs"'):html.index('id="openenv-runs"') + 300]
    second = operator_client.get(PAGE).content.decode()
    assert _key(html).startswith("ui:") and _key(html) != _key(second)
    row = operator_client.get("/ui/training/openenv/environment-row/").content.decode()
    for name in ("environment_url", "credential_id", "environment_reset_options", "row_id"):
        assert f'name="{name}"' in row
    assert "Remove" in row and "Inspect" in row


def test_the_credential_hint_names_the_configured_handles(operator_client, settings):
    from dataclasses import replace

    def hints():
        page = operator_client.get(PAGE).content.decode()
        row = operator_client.get("/ui/training/openenv/environment-row/").content.decode()
        return [re.sub(r"\s+", " ", re.search(r'class="hint env-credential-hint">(.*?)</p>', html, re.S).group(1))
                for html in (page, row)]

    assert all("none is configured in kiln.toml, so any handle is refused" in h for h in hints())
    settings.KILN = replace(settings.KILN, openenv_credentials={
        "team": {"origin": "http://127.0.0.1:8990", "bearer_token_env": "TEAM_TOKEN"},
        "arcade": {"origin": "https://env.example", "bearer_token_env": "ARCADE_TOKEN"}})
    for hint in hints():
        assert '<span class="mono">arcade, team</span>' in hint and "refused" not in hint
        assert "TEAM_TOKEN" not in hint and "env.example" not in hint  # handles only


def test_without_a_model_the_page_says_train_runs_are_refused(operator_client, settings):
    from dataclasses import replace

    assert 'id="no-model"' not in operator_client.get(PAGE).content.decode()  # tests/settings.py has one
    settings.KILN = replace(settings.KILN, model_path=None)
    html = operator_client.get(PAGE).content.decode()
    banner = re.search(r'<p class="message error" id="no-model">(.*?)</p>', html, re.S).group(1)
    assert "train runs are refused" in re.sub(r"\s+", " ", banner) and "KILN_MODEL_PATH" in banner


def test_submit_records_a_run_whose_request_is_the_posted_body_normalized(operator_client, operator):
    data = _form(environment_url=[URL_A, URL_B], credential_id=["", ""], row_id=["0", "1"],
                 environment_reset_options=['{"target": 4, "seed": 9}', ""], groups="3", group_size="2",
                 seed_start="9223372036854775000", max_steps="5", concurrency="3", max_action_tokens="300",
                 temperature="0.7", thinking_budget_tokens="100", protocol_error_reward="-0.5",
                 max_recoverable_errors="2", capacity_wait_seconds="12.5")
    response = operator_client.post(PAGE, data)
    assert response.status_code == 302, unescape(response.content.decode())
    run = OpenEnvRun.objects.get()
    assert response["Location"] == f"{PAGE}#run-{run.id}"
    posted = {"kind": "rollout", "idempotency_key": "ui:test-1", "environment_urls": [URL_A, URL_B],
              "adapter": "base", "groups": 3, "group_size": 2, "seed_start": 9223372036854775000, "max_steps": 5,
              "concurrency": 3, "max_action_tokens": 300, "temperature": 0.7, "thinking": True,
              "thinking_budget_tokens": 100, "protocol_error_reward": -0.5, "max_recoverable_errors": 2,
              "capacity_wait_seconds": 12.5, "auto_load": True,
              "environment_reset_options": [{"target": 4, "seed": 9}, {}]}
    assert run.request == normalize(posted)
    assert run.request["environment_urls"] == ["http://127.0.0.1:8990", "http://localhost:8991"]
    assert run.idempotency_key == "ui:test-1" and run.submitted_by == operator
    assert run.state == "discovering" and run.job is not None  # admitted: its openenv.run job is queued
    page = operator_client.get(PAGE).content.decode()
    assert f'id="run-{run.id}"' in page and "submitted (discovering)" in page
    assert 'hx-trigger="every 2s"' in page  # an active run: the cards poll


def test_a_double_submit_with_the_same_key_makes_one_run_and_a_changed_reuse_is_refused(operator_client):
    first = operator_client.post(PAGE, _form())
    second = operator_client.post(PAGE, _form())
    assert first.status_code == second.status_code == 302
    run = OpenEnvRun.objects.get()
    assert first["Location"] == second["Location"] == f"{PAGE}#run-{run.id}"
    assert "already submitted" in operator_client.get(PAGE).content.decode()
    changed = operator_client.post(PAGE, _form(groups="4"))
    assert changed.status_code == 409
    assert _error(changed)[0] == "openenv_run_idempotency_conflict"
    assert OpenEnvRun.objects.count() == 1
    assert _key(changed.content.decode()) != "ui:test-1"  # the page comes back with a fresh key
    # Without a key (an API-style body from elsewhere) each submit is its own run; the form always has one.
    operator_client.post(PAGE, _form(idempotency_key="ui:test-2", seed_start="500"))
    assert OpenEnvRun.objects.count() == 2


@pytest.mark.parametrize(("fields", "status", "code", "field", "text"), [
    ({"groups": "many"}, 400, "openenv_invalid_request", "groups", "groups: must be an integer"),
    ({"group_size": "0"}, 400, "openenv_invalid_request", "group_size", "must lie within 1..256"),
    ({"environment_url": ["ftp://127.0.0.1:1"]}, 400, "openenv_invalid_request", "environment_url-0", ""),
    ({"environment_url": ["http://10.1.2.3:8990"]}, 403, "openenv_remote_environment_refused",
     "environment_url-0", "not a loopback address"),
    ({"credential_id": ["team-token"]}, 400, "openenv_credential_not_found", "credential_id-0",
     "no server credential named 'team-token'"),
    ({"credential_id": ["has space"]}, 400, "openenv_invalid_request", "credential_id-0", "handle of 1..64"),
    ({"reset_options": "{not json"}, 400, "openenv_invalid_request", "reset_options", "not valid JSON"),
    ({"reset_options": '{"a": 1}', "environment_reset_options": ['{"b": 2}']}, 400, "openenv_invalid_request",
     "environment_reset_options-0", "exclusive"),
    ({"thinking": "", "thinking_budget_tokens": "10"}, 400, "openenv_invalid_request", "thinking_budget_tokens",
     "needs thinking on"),
    ({"output_adapter": "counter-agent"}, 400, "openenv_invalid_request", "output_adapter", "only for kind train"),
    ({"environment_eval": "on"}, 400, "openenv_invalid_request", "environment_eval", "only for kind train"),
    ({"adapter": "missing-adapter"}, 404, "adapter_not_found", "adapter", "no published adapter"),
    ({"adapter": "../up"}, 400, "invalid_adapter_name", "adapter", "is not an adapter name"),
    ({"groups": "1", "environment_url": [URL_A, URL_B], "credential_id": ["", ""],
      "environment_reset_options": ["", ""]}, 400, "openenv_invalid_request", "groups", "cannot cover 2"),
    ({"kind": "train", "output_adapter": "counter-agent", "environment_eval": "on", "ee_seed_start": "101"}, 400,
     "openenv_invalid_request", "ee_seed_start", "overlap"),
    ({"kind": "train", "output_adapter": "counter-agent", "gate": "on", "ee_groups": "5"}, 400,
     "openenv_invalid_request", "ee_groups", "at least 20"),
    ({"kind": "train", "output_adapter": "counter-agent", "gate": "on", "gate_min_mean_improvement": "-1"}, 400,
     "openenv_invalid_request", "gate_min_mean_improvement", "at least 0"),
    ({"kind": "train", "output_adapter": "counter-agent", "training_config_json": "[1]"}, 400,
     "openenv_invalid_request", "training_config_json", "JSON object"),
    ({"kind": "train"}, 400, "openenv_invalid_request", "output_adapter", "required for kind train"),
])
def test_a_bad_field_is_shown_next_to_the_form_and_nothing_is_recorded(operator_client, fields, status, code,
                                                                       field, text):
    response = operator_client.post(PAGE, _form(**fields))
    assert response.status_code == status
    got_code, message = _error(response)
    assert got_code == code and text in message, message
    html = unescape(response.content.decode())
    assert f'id="error-{field}"' in html, field
    assert re.search(rf'id="error-{re.escape(field)}" role="alert"><code>{code}</code>', html)
    assert OpenEnvRun.objects.count() == 0
    # What was typed comes back.
    for name, value in fields.items():
        for one in value if isinstance(value, list) else [value]:
            if one and name not in ("thinking", "environment_eval", "gate", "kind"):
                assert one.replace('"', "&quot;") in response.content.decode() or one in html, (name, one)


def _api_answer(client, body) -> tuple[int, str]:
    response = client.post("/v1/openenv/runs", data=json.dumps(body), content_type="application/json")
    return response.status_code, response.json().get("error", {}).get("code", "")


@pytest.mark.parametrize("fields", [
    {"kind": "train", "output_adapter": "counter-agent", "environment_eval": "on", "gate": "on",
     "gate_min_mean_improvement": "0.05", "tc_lora_rank": "8", "idempotency_key": "ui:train-1"},
    {"groups": "0", "idempotency_key": "ui:bad-1"},
    {"credential_id": ["team"], "idempotency_key": "ui:bad-2"},
])
def test_the_form_answers_what_post_v1_openenv_runs_answers_for_the_same_body(operator_client, fields):
    """One set of rules: the same body through the route (session-authenticated) and through the form."""
    from kiln_project.ui.openenv_form import form_values, request_body

    data = _form(**fields)
    body = request_body(form_values(QueryDict(urlencode(data, doseq=True))))
    api_status, api_code = _api_answer(operator_client, body)
    OpenEnvRun.objects.all().delete()
    response = operator_client.post(PAGE, data)
    if api_status in (200, 202):
        assert response.status_code == 302 and OpenEnvRun.objects.count() == 1
    else:
        assert (response.status_code, _error(response)[0]) == (api_status, api_code)
        assert OpenEnvRun.objects.count() == 0


def test_a_viewer_may_not_submit(viewer_client):
    denied = viewer_client.post(PAGE, _form())
    assert denied.status_code == 403 and _error(denied)[0] == "permission_denied"
    assert 'id="needs-permission"' in viewer_client.get(PAGE).content.decode()
    assert OpenEnvRun.objects.count() == 0


def test_cancel_posts_to_the_cancel_service(operator_client, operator, viewer_client):
    run, _ = run_submit(request=normalize({"kind": "rollout", "environment_urls": [URL_A]}), user=operator)
    assert run.state == "discovering" and run.job.state == JobState.QUEUED
    page = operator_client.get(PAGE).content.decode()
    assert f'action="/ui/training/openenv/runs/{run.id}/cancel/"' in page
    assert viewer_client.post(f"/ui/training/openenv/runs/{run.id}/cancel/").status_code == 302
    run.refresh_from_db()
    assert run.state == "discovering"  # the viewer's cancel was refused
    response = operator_client.post(f"/ui/training/openenv/runs/{run.id}/cancel/")
    assert response.status_code == 302 and response["Location"] == f"{PAGE}#run-{run.id}"
    run.refresh_from_db()
    run.job.refresh_from_db()
    assert run.state == "cancelled" and run.job.state == JobState.CANCELLED
    page = operator_client.get(PAGE).content.decode()
    assert "cancelled." in page and f'action="/ui/training/openenv/runs/{run.id}/cancel/"' not in page
    again = operator_client.get(PAGE)  # a terminal run shows no cancel button; a stale POST is an error message
    assert again.status_code == 200
    stale = operator_client.post(f"/ui/training/openenv/runs/{run.id}/cancel/", follow=True)
    assert stale.status_code == 200 and "openenv_run_not_cancellable" in stale.content.decode()
    assert operator_client.post("/ui/training/openenv/runs/00000000-0000-0000-0000-000000000000/cancel/") \
        .status_code == 404
    back = operator_client.get(f"/ui/training/openenv/runs/{run.id}/cancel/")  # back to a page, cancels nothing
    assert back.status_code == 302 and back["Location"].startswith("/ui/training/openenv/")


def test_another_submitters_card_offers_no_cancel(operator_client, operator):
    """QA: every active card showed "Cancel run" to users the service then refused
    (openenv_run_cancel_forbidden); a job page already hid it from non-owners."""
    from core.accounts.services import user_create
    from tests.ui.conftest import PASSWORD

    run, _ = run_submit(request=normalize({"kind": "rollout", "environment_urls": [URL_A]}), user=operator)
    colleague = Client()
    colleague.force_login(user_create(username="colleague", password=PASSWORD))
    page = colleague.get(PAGE).content.decode()
    assert f'action="/ui/training/openenv/runs/{run.id}/cancel/"' not in page
    assert "Cancelling another user's run needs the delete_others_jobs permission" in page
    assert f'action="/ui/training/openenv/runs/{run.id}/cancel/"' in operator_client.get(PAGE).content.decode()


STATS = {"mean_episode_return": 0.625, "min_episode_return": -1.0, "max_episode_return": 2.5, "done_count": 5,
         "max_steps_count": 2, "invalid_model_action_count": 1, "protocol_error_count": 0,
         "recoverable_protocol_error_count": 3, "capacity_retry_count": 4, "total_environment_steps": 37,
         "total_model_tokens": 4321, "mean_model_latency_ms": 1234.5}
SHA = "sha256:" + "ab" * 32


def _card(html: str, run) -> str:
    """One run's card (its <article>) out of the runs fragment."""
    card = html[html.index(f'id="run-{run.id}"'):]
    return card[:card.index("</article>")]


def _ready(run):
    OpenEnvRun.objects.filter(id=run.id).update(
        state="rollout_ready", stage="artifact_publication", finished_at=timezone.now(),
        progress={"groups_completed": 2, "groups_total": 2, "rollouts_completed": 8, "rollouts_total": 8},
        rollout_stats=STATS, artifacts=[{"kind": "dataset", "file": "rollouts.jsonl", "sha256": SHA, "bytes": 999}])


def test_run_cards_show_the_status_documents_values(operator_client, operator):
    ready, _ = run_submit(request=normalize({"kind": "rollout", "environment_urls": [URL_A], "groups": 2,
                                             "group_size": 4}), user=operator)
    _ready(ready)
    failed, _ = run_submit(request=normalize({"kind": "rollout", "environment_urls": [URL_A], "seed_start": 50}),
                           user=operator)
    OpenEnvRun.objects.filter(id=failed.id).update(state="failed", stage="collection", finished_at=timezone.now(),
                                                   failure={"code": "environment_capacity_exhausted",
                                                            "stage": "collection", "retryable": True,
                                                            "message": "CAPACITY_REACHED for 5 s", "hint": "later"})
    collecting, _ = run_submit(request=normalize({"kind": "rollout", "environment_urls": [URL_A], "groups": 4,
                                                  "seed_start": 900}), user=operator)
    OpenEnvRun.objects.filter(id=collecting.id).update(
        state="collecting", stage="collection",
        progress={"groups_completed": 1, "groups_total": 4, "rollouts_completed": 6, "rollouts_total": 16})

    fragment = operator_client.get(PAGE + "?fragment=runs")
    html = unescape(fragment.content.decode())
    assert fragment.status_code == 200 and html.lstrip().startswith('<section class="card" id="openenv-runs"')
    assert 'hx-trigger="every 2s"' in html  # one run is still collecting
    card = _card(html, ready)
    shown = card + " ".join(re.sub(r"<[^>]+>", " ", card).split())  # the markup and the text on screen
    for text in ("rollout_ready", "stage artifact_publication", "2 / 2 groups", "8 / 8 rollouts", "mean 0.625",
                 "range [-1, 2.5]", "done 5 · max_steps 2 · invalid_model_action 1 · protocol_error 0",
                 '<dd class="mono run-recoveries">3</dd>', '<dd class="mono run-capacity-retries">4</dd>',
                 '<dd class="mono run-steps">37</dd>', '<dd class="mono run-tokens">4321</dd>', "1.23 s",
                 f'href="/v1/openenv/runs/{ready.id}/artifacts/dataset"', SHA, ">999<"):
        assert text in shown, text
    assert "cancel-run" not in card  # terminal
    bad = _card(html, failed)
    assert "environment_capacity_exhausted" in bad and "CAPACITY_REACHED for 5 s" in bad and "retryable" in bad
    live = _card(html, collecting)
    assert "1 / 4 groups" in live and "6 / 16 rollouts" in live and "cancel-run" in live and 'value="25"' in live

    OpenEnvRun.objects.filter(id=collecting.id).update(state="cancelled", finished_at=timezone.now())
    done = operator_client.get(PAGE + "?fragment=runs").content.decode()
    assert "hx-trigger" not in done and 'data-active="false"' in done  # all terminal: the polling stops


def test_a_train_runs_card_shows_contract_trainer_and_gate_when_the_status_has_them(operator_client, operator,
                                                                                     monkeypatch):
    """The train fields (another part of the OpenEnv work) come from the status document when it has them."""
    from openenv.runs import selectors

    run, _ = run_submit(request=normalize({"kind": "rollout", "environment_urls": [URL_A]}), user=operator)
    _ready(run)
    job_id = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"
    extra = {
        "state": "environment_evaluating", "stage": "environment_evaluation",
        "training_contract": {"schema": "kiln.openenv-training-contract.v1",
                              "effective_config": {"output_name": "counter-agent", "lora_rank": 8,
                                                   "behavior_policy": "no_importance_correction"}},
        "training_contract_sha256": SHA,
        "training_selection": {"groups_submitted": 7, "rollouts_submitted": 28, "no_output_rollouts_discarded": 1,
                               "no_usable_output_groups_skipped": 0, "no_reward_gradient_groups_skipped": 1,
                               "warnings": []},
        "training_job_id": job_id,
        "training": {"job_id": job_id, "state": "completed", "progress": 1.0, "current_loss": 0.0423, "epoch": 1,
                     "step": 12, "total_steps": 12, "adapter_name": "counter-agent", "linked_eval_job_ids": [],
                     "gate_outcome": None, "error": None},
        "post_evaluations": [{"job_id": job_id, "suite_name": "math-heldout", "state": "failed",
                              "examples_completed": 40, "examples_total": 40, "headline_accuracy": 0.725,
                              "error": {"code": "eval_failed", "message": "scorer crashed"}}],
        "environment_evaluation": {
            "state": "completed", "seed_start": 1000, "groups": 20, "group_size": 1,
            "baseline": {"adapter": None}, "candidate": {"adapter": "counter-agent"},
            "baseline_stats": {"mean_episode_return": 0.4}, "candidate_stats": {"mean_episode_return": 1.9},
            "evidence": {"policy_version": "paired_return_sign_test_v1", "paired_groups": 20, "paired_episodes": 20,
                         "improved_groups": 17, "regressed_groups": 1, "tied_groups": 2,
                         "exact_sign_test_p_value": 0.0001449584960937, "exact_sign_test_alpha": 0.05,
                         "mean_return_improvement": 1.5, "decision": "passed", "reason": "improved"},
            "outcome": "promoted", "verdict": "passed"},
        "warnings": [{"code": "no_reward_gradient_group_skipped", "message": "group 3: identical rewards"}],
    }
    original = selectors.runs_status_list
    monkeypatch.setattr(selectors, "runs_status_list",
                        lambda **kw: {**original(**kw), "runs": [{**r, **extra} for r in original(**kw)["runs"]]})
    html = unescape(operator_client.get(PAGE + "?fragment=runs").content.decode())
    assert 'hx-trigger="every 2s"' in html  # environment_evaluating is not terminal
    for text in ("environment_evaluating", "kiln.openenv-training-contract.v1", "counter-agent",
                 "no_importance_correction", f'href="/ui/jobs/{job_id}/"', "run-trainer-state\">completed",
                 "loss <span class=\"mono\">0.0423</span>", "math-heldout", "0.725", "promoted",
                 "p = <span class=\"mono run-gate-p\" title=\"\">0.000144958</span>", "(α 0.05)",
                 "17 improved, 1 regressed, 2 tied", "of 20 paired groups", "passed",
                 "no_reward_gradient_group_skipped", "Baseline return", "1.9", SHA[:23],
                 "7</span> groups, <span class=\"mono\">28</span> rollouts submitted",
                 "1 groups without a reward gradient skipped", "step <span class=\"mono run-trainer-step\">12 / 12",
                 "<code>eval_failed</code> scorer crashed"):
        assert text in html, text


def test_a_runs_card_says_why_when_most_episodes_ended_at_a_refused_action(operator_client, operator):
    """The warning a run publishes (openenv.runs.jobs, built by openenv.collector.diagnosis) is on its card."""
    from openenv.collector.diagnosis import invalid_action_warning
    from tests.openenv.test_diagnosis import SCHEMA, completion, groups_of

    warning = invalid_action_warning(groups_of(*[completion("invalid_model_action", *SCHEMA)] * 3, completion("done")))
    run, _ = run_submit(request=normalize({"kind": "rollout", "environment_urls": [URL_A]}), user=operator)
    _ready(run)
    OpenEnvRun.objects.filter(id=run.id).update(warnings=[warning])
    html = unescape(operator_client.get(PAGE + "?fragment=runs").content.decode())
    card = _card(html, run)
    listed = re.search(r'<ul class="run-warnings"><li class="message warning">(.*?)</li>', card, re.S)
    assert listed and listed.group(1) == warning
    assert listed.group(1).startswith("3 of 4 episodes ended at an action Kiln refused (ACTION_SCHEMA_VALIDATION_FAILED 3")


def test_inspect_answers_errors_in_the_fragment(operator_client, viewer_client):
    blank = operator_client.post("/ui/training/openenv/inspect/", {"environment_url": [""], "row_id": ["0"],
                                                                  "row": "0"})
    assert blank.status_code == 200 and "openenv_invalid_request" in blank.content.decode()
    remote = operator_client.post("/ui/training/openenv/inspect/", {"environment_url": ["http://192.0.2.1:1"]})
    assert "openenv_remote_environment_refused" in remote.content.decode()
    handle = operator_client.post("/ui/training/openenv/inspect/", {"environment_url": [URL_A],
                                                                   "credential_id": ["team"]})
    assert "openenv_credential_not_found" in handle.content.decode()
    # The second row's Inspect reads the second row (the whole form is posted).
    second = operator_client.post("/ui/training/openenv/inspect/", {
        "environment_url": [URL_A, "http://192.0.2.9:1"], "credential_id": ["", ""], "row_id": ["0", "ab12"],
        "row": "ab12"})
    assert "192.0.2.9" in second.content.decode()
    assert "permission_denied" in viewer_client.post("/ui/training/openenv/inspect/",
                                                     {"environment_url": [URL_A]}).content.decode()


@pytest.mark.integration
def test_inspect_shows_the_schema_hashes_and_the_task_catalog_of_a_real_server(operator_client, tmp_path):
    from openenv.client.discovery import inspect
    from openenv.client.urls import normalize_url
    from tests.openenv.real_server import RealServer, openenv_python

    with RealServer(openenv_python(), tmp_path) as server:
        import asyncio

        expected = asyncio.run(inspect(normalize_url(server.url))).identity
        response = operator_client.post("/ui/training/openenv/inspect/",
                                        {"environment_url": [server.url], "row_id": ["0"], "row": "0"})
    html = unescape(response.content.decode())
    assert response.status_code == 200 and "inspect-error" not in html, html
    assert f'data-schema-sha256="{expected["schema_sha256"]}"' in html
    for key in ("schema_sha256", "action_schema_sha256", "discovery_sha256"):
        assert expected[key] in html
    assert "kiln_counter" in html and '"delta"' in html and "Task catalog" in html
    assert f'<dt>OpenAPI info.version</dt><dd class="mono">{expected["openapi_version"]}</dd>' in html  # not 3.1.0


def test_a_lora_rank_without_alpha_keeps_the_clis_alpha_over_rank_of_two():
    """As `kiln openenv train --lora-rank 8`: a rank alone must not inherit the default alpha 32 (scale
    4 is refused as unsafe_lora_scale); an alpha the training-config JSON gives is kept."""
    from kiln_project.ui.openenv_form import form_values, request_body

    def config(**fields):
        data = _form(kind="train", output_adapter="counter-agent", **fields)
        return request_body(form_values(QueryDict(urlencode(data, doseq=True))))["training_config"]

    assert config(tc_lora_rank="8") == {"lora_rank": 8, "lora_alpha": 16}
    assert config(tc_lora_rank="8", training_config_json='{"lora_alpha": 8}') == {"lora_alpha": 8, "lora_rank": 8}


def test_a_train_runs_card_draws_its_training_jobs_curves(operator_client, operator, monkeypatch):
    """Loss, reward and KL as the training job records them (its metric histories), on the card itself."""
    from core.jobs.models import Job
    from core.jobs.services import job_submit
    from openenv.runs import selectors

    job = job_submit(kind="test.steps", payload={"steps": 1}, user=operator, title="trainer")
    Job.objects.filter(id=job.id).update(metrics={
        "loss_history": [{"step": 1, "loss": 0.9}, {"step": 2, "loss": 0.5}, {"step": 3, "loss": 0.25}],
        "reward_history": [{"step": 1, "reward_mean": -0.6}, {"step": 3, "reward_mean": 0.4}]})
    run, _ = run_submit(request=normalize({"kind": "rollout", "environment_urls": [URL_A]}), user=operator)
    _ready(run)
    extra = {"training_job_id": str(job.uuid), "training": {"job_id": str(job.uuid), "state": "running",
                                                            "progress": 0.5}}
    original = selectors.runs_status_list
    monkeypatch.setattr(selectors, "runs_status_list",
                        lambda **kw: {**original(**kw), "runs": [{**r, **extra} for r in original(**kw)["runs"]]})
    html = unescape(operator_client.get(PAGE + "?fragment=runs").content.decode())
    assert html.count('class="curve run-curve"') == 2 and 'data-curve="kl"' not in html  # no KL points: not drawn
    assert 'data-curve="loss"' in html and 'run-curve-last">0.25' in html
    assert 'run-curve-last">0.4' in html and "step 1–3 · low -0.6 · high 0.4" in html


def test_older_runs_are_reachable_by_page_and_by_id(operator_client, operator):
    """Past the newest CARD_LIMIT cards an "Older runs" link pages on; ?run=<id> shows any one run."""
    from kiln_project.ui.openenv_views import CARD_LIMIT

    runs = []
    for seed in range(CARD_LIMIT + 2):
        run, _ = run_submit(request=normalize({"kind": "rollout", "environment_urls": [URL_A], "seed_start": seed,
                                               "idempotency_key": f"ui:page-{seed}"}), user=operator)
        _ready(run)
        runs.append(run)
    OpenEnvRun.objects.filter(id=runs[0].id).update(state="collecting")  # the oldest is live: its page polls
    oldest, second, third = runs[:3]

    first = unescape(operator_client.get(PAGE).content.decode())
    assert f'id="run-{oldest.id}"' not in first and f'id="run-{third.id}"' in first
    assert f'href="{PAGE}?run={third.id}#run-{third.id}"' in first  # each card's id links to it alone
    older = re.search(r'id="runs-older" href="([^"]+)"', first).group(1)
    assert older == f"{PAGE}?before={third.sequence}#openenv-runs"

    page = unescape(operator_client.get(older.split("#")[0] + "&fragment=runs").content.decode())
    assert f'id="run-{oldest.id}"' in page and f'id="run-{second.id}"' in page and f'id="run-{third.id}"' not in page
    assert 'id="runs-older"' not in page and 'id="runs-newest"' in page
    assert f'hx-get="{PAGE}?fragment=runs&before={third.sequence}"' in page  # the polling keeps the page
    beyond = unescape(operator_client.get(f"{PAGE}?fragment=runs&before={oldest.sequence}").content.decode())
    assert "No older OpenEnv runs." in beyond

    alone = unescape(operator_client.get(f"{PAGE}?run={second.id}").content.decode())
    section = alone[alone.index('id="openenv-runs"'):]
    section = section[:section.index("</section>")]
    assert section.count('<article class="card run-card') == 1 and f'id="run-{second.id}"' in section
    assert operator_client.get(f"{PAGE}?run=00000000-0000-0000-0000-000000000000").status_code == 404
    # a malformed selection is a stale link: the newest runs
    assert f'id="run-{third.id}"' in operator_client.get(f"{PAGE}?before=x&fragment=runs").content.decode()
