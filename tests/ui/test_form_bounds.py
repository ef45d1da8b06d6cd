"""The GRPO and OpenEnv forms turn fields into the API's request body without changing its answer:
a seed is a number (the API's bound answers it), an upload is bounded like any request body, and the
environment-evaluation block is sent only when its checkbox is on."""

from __future__ import annotations

import json
import re
from html import unescape
from urllib.parse import urlencode

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.http import QueryDict

from core.jobs.models import Job
from openenv.models import OpenEnvRun

pytestmark = pytest.mark.django_db

GRPO = "/ui/training/grpo/"
GROUP = {"messages": [{"role": "user", "content": "What is 2 + 3?"}],
         "completions": [{"text": "5", "reward": 1.0}, {"text": "6", "reward": 0.0}]}


def _grpo_form(**fields) -> dict:
    upload = SimpleUploadedFile("groups.jsonl", (json.dumps(GROUP) + "\n").encode(), content_type="application/x-ndjson")
    return {"output_name": "math-r001", "behavior_policy": "no_importance_correction", "base_adapter": "",
            "lora_rank": "", "learning_rate": "", "kl_coeff": "", "checkpoint_interval": "", "seed": "",
            "advanced_config": "", "dataset_path": "", "jsonl_file": upload, **fields}


def _field_error(html: str, field: str) -> str:
    error = html[html.index(f'id="error-{field}"'):]
    return unescape(error[:error.index("</p>")])


def test_a_negative_seed_gets_the_apis_bound_not_a_type_error(operator_client):
    response = operator_client.post(GRPO, _grpo_form(seed="-5"))
    assert response.status_code == 400
    error = _field_error(response.content.decode(), "seed")
    assert "<code>training_invalid_request</code>" in error
    assert "config.seed: must be >= 0, got -5" in error, error
    assert "got str" not in error
    assert Job.objects.count() == 0


def test_a_word_in_a_number_field_is_quoted_not_named_by_its_python_type(operator_client):
    """QA: LoRA rank `abc` said "must be an integer, got str"; a form user never sent a "str"."""
    response = operator_client.post(GRPO, _grpo_form(lora_rank="abc"))
    assert response.status_code == 400
    error = _field_error(response.content.decode(), "lora_rank")
    assert "config.lora_rank: must be an integer, got 'abc' (a string)" in error, error
    assert Job.objects.count() == 0


@pytest.mark.parametrize("seed, stored", [("7", "7"), ("18446744073709551615", "18446744073709551615")])
def test_a_seed_from_the_form_is_the_jobs_seed(operator_client, seed, stored):
    response = operator_client.post(GRPO, _grpo_form(seed=seed))
    assert response.status_code == 302, response.content.decode()[:2000]
    job = Job.objects.get()
    assert str(job.payload["config"]["seed"]) == stored


def test_a_text_seed_is_still_answered_by_the_api(operator_client):
    response = operator_client.post(GRPO, _grpo_form(seed="abc"))
    assert response.status_code == 400
    assert "config.seed: must be an integer" in _field_error(response.content.decode(), "seed")


def test_a_grpo_upload_over_the_request_limit_is_request_too_large_like_the_datasets_form(operator_client, settings):
    limit = settings.KILN.max_request_bytes
    assert limit == 8 * 1024 * 1024  # the README's default
    line = (json.dumps(GROUP) + "\n").encode()
    data = line * (9 * 1024 * 1024 // len(line) + 1)  # 9 MiB of valid groups
    big = SimpleUploadedFile("big.jsonl", data, content_type="application/x-ndjson")
    response = operator_client.post(GRPO, _grpo_form(jsonl_file=big))
    assert response.status_code == 413
    error = _field_error(response.content.decode(), "jsonl_file")
    assert "<code>request_too_large</code>" in error
    assert f"the file is {len(data)} bytes; an upload may hold at most {limit}" in error
    assert "KILN_MAX_REQUEST_BYTES" in error
    assert Job.objects.count() == 0
    # The datasets form answers the same file with the same code and status.
    dataset = operator_client.post("/ui/evaluations/datasets/", {
        "name": "big", "format": "grpo_groups", "description": "",
        "file": SimpleUploadedFile("big.jsonl", data, content_type="application/x-ndjson")})
    assert dataset.status_code == 413 and "request_too_large" in dataset.content.decode()


# ---- OpenEnv form: environment_eval only with its checkbox -----------------------------------------

def _openenv_values(**fields):
    from kiln_project.ui.openenv_form import form_values

    data = {"kind": "rollout", "idempotency_key": "ui:test-ee", "adapter": "base",
            "environment_url": ["http://127.0.0.1:8990"], "credential_id": [""], "environment_reset_options": [""],
            "groups": "2", "group_size": "2", "seed_start": "100", "max_steps": "4", "concurrency": "2",
            "max_action_tokens": "256", "temperature": "1.0", "thinking": "on", "protocol_error_reward": "-1.0",
            "max_recoverable_errors": "3", "capacity_wait_seconds": "5", "auto_load": "on",
            "post_eval_data_scope": "held-out", "ee_groups": "20", "ee_group_size": "1", "ee_seed_start": "",
            "gate_min_mean_return": "", "gate_min_mean_improvement": "", **fields}
    return form_values(QueryDict(urlencode(data, doseq=True)))


def test_eval_numbers_without_the_checkbox_are_not_sent():
    from kiln_project.ui.openenv_form import request_body

    for typed in ({"ee_groups": "30"}, {"ee_group_size": "2", "ee_seed_start": "500"},
                  {"gate_min_mean_return": "0.5"}):
        body = request_body(_openenv_values(**typed))
        assert "environment_eval" not in body, (typed, body)


def test_eval_block_follows_its_checkboxes():
    from kiln_project.ui.openenv_form import request_body

    on = request_body(_openenv_values(kind="train", environment_eval="on", ee_groups="30"))
    assert on["environment_eval"] == {"groups": 30, "group_size": 1}
    gated = request_body(_openenv_values(kind="train", gate="on", gate_min_mean_improvement="0.05"))
    assert gated["environment_eval"] == {"groups": 20, "group_size": 1, "gate": {"min_mean_improvement": 0.05}}
    no_gate = request_body(_openenv_values(kind="train", environment_eval="on", gate_min_mean_return="1"))
    assert no_gate["environment_eval"] == {"groups": 20, "group_size": 1}


def test_a_rollout_with_changed_eval_groups_is_not_refused_for_environment_eval(operator_client):
    from kiln_project.ui.openenv_form import form_values

    data = {k: v for k, v in _openenv_values(ee_groups="30").items() if k != "rows"}
    data.update(environment_url=["http://127.0.0.1:8990"], credential_id=[""], environment_reset_options=[""],
                thinking="on", auto_load="on")
    for name in ("environment_eval", "gate", "post_eval_include_baseline"):
        data.pop(name, None)
    assert form_values(QueryDict(urlencode(data, doseq=True)))["environment_eval"] is False
    response = operator_client.post("/ui/training/openenv/", data)
    html = unescape(response.content.decode())
    assert "only for kind train" not in html and not re.search(r'id="form-error-code">', html)
    assert response.status_code == 302
    assert OpenEnvRun.objects.count() == 1 and OpenEnvRun.objects.get().kind == "rollout"
