"""Training → GRPO, the training section of a job page, and the adapter pages, through the test client.

Submissions go through the real admission service (training.services.grpo_submit): a queued job,
a pinned snapshot and a reserved adapter name, or an error shown next to its field and nothing stored.
"""

from __future__ import annotations

import json
import math
import re
from html import unescape
from pathlib import Path

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.utils.html import escape

from adapters.models import Adapter
from adapters.services import adapter_publish
from core.jobs import services as job_services
from core.jobs.models import Job, JobState
from core.sparkline import sparkline
from training.services import grpo_submit

pytestmark = pytest.mark.django_db

GROUP = {"messages": [{"role": "user", "content": "What is 2 + 3?"}],
         "completions": [{"text": "5", "reward": 1.0}, {"text": "6", "reward": 0.0}]}


def _jsonl(*groups, name="groups.jsonl") -> SimpleUploadedFile:
    data = "\n".join(g if isinstance(g, str) else json.dumps(g) for g in groups) + "\n"
    return SimpleUploadedFile(name, data.encode(), content_type="application/x-ndjson")


def _form(**fields) -> dict:
    return {"output_name": "", "behavior_policy": "no_importance_correction", "base_adapter": "",
            "lora_rank": "", "learning_rate": "", "kl_coeff": "", "checkpoint_interval": "", "seed": "",
            "advanced_config": "", "dataset_path": "", **fields}


def _submit(user, name: str, **config):
    job, _ = grpo_submit(body={"groups": [GROUP], "config": {"output_name": name, **config}}, user=user)
    return job


def _polyline_points(html: str, curve: str) -> int:
    figure = html[html.index(f'id="curve-{curve}"'):]
    figure = figure[:figure.index("</figure>")]
    match = re.search(r'<polyline class="line" points="([^"]*)"', figure)
    return len(match.group(1).split()) if match else 0


# ---- the form ---------------------------------------------------------------------------------

def test_grpo_page_shows_the_form_and_an_empty_queue(operator_client):
    html = operator_client.get("/ui/training/grpo/").content.decode()
    assert 'enctype="multipart/form-data"' in html and 'id="grpo-form"' in html
    for name in ("jsonl_file", "dataset_path", "output_name", "behavior_policy", "base_adapter", "lora_rank",
                 "learning_rate", "kl_coeff", "checkpoint_interval", "auto_load", "seed", "advanced_config"):
        assert f'name="{name}"' in html, name
    assert '<option value="recorded">' in html
    assert "No published adapter yet" in html
    assert 'id="needs-permission"' not in html and "<fieldset disabled" not in html
    assert 'ws-connect="/ws/ui/training/queue/"' in html
    assert "No GRPO training is running." in html and "Nothing is waiting." in html
    assert "No GRPO training has finished yet." in html
    assert 'id="no-model"' not in html  # a model is configured (tests/settings.py)


def test_without_a_model_the_page_says_so_and_a_submission_is_refused_with_mock_mode(
    operator_client, settings
):
    import dataclasses

    settings.KILN = dataclasses.replace(settings.KILN, model_path=None)
    html = operator_client.get("/ui/training/grpo/").content.decode()
    assert 'id="no-model"' in html and "KILN_MODEL_PATH" in html
    upload = SimpleUploadedFile("g.jsonl", (json.dumps(GROUP) + "\n").encode())
    response = operator_client.post("/ui/training/grpo/", {"jsonl_file": upload, "output_name": "m-r001"})
    assert response.status_code == 503
    html = response.content.decode()
    assert "<code>mock_mode</code>" in html and "Nothing was queued." in html
    assert not Job.objects.exists()


def test_upload_queues_a_training_job_and_redirects_to_its_page(operator_client, operator):
    form = _form(output_name="math-r001", lora_rank="16", learning_rate="2e-5", kl_coeff="0.05",
                 checkpoint_interval="5", seed="18446744073709551615",
                 advanced_config='{"is_level": "sequence", "lora_rank": 64}',
                 jsonl_file=_jsonl(GROUP, "", GROUP))
    response = operator_client.post("/ui/training/grpo/", form)
    job = Job.objects.get()
    assert response.status_code == 302 and response["Location"] == f"/ui/jobs/{job.uuid}/"
    assert (job.kind, job.state, job.submitted_by) == ("training.grpo", JobState.QUEUED, operator)
    config = job.payload["config"]
    assert config["output_name"] == "math-r001"
    assert config["lora_rank"] == 16  # the field wins over the advanced JSON
    assert config["learning_rate"] == 2e-5 and config["kl_coeff"] == 0.05
    assert config["checkpoint_interval"] == 5 and config["is_level"] == "sequence"
    assert config["auto_load"] is False  # an unchecked box
    assert job.payload["effective_seed"] == "18446744073709551615"
    assert job.payload["route"] == "/ui/training/grpo/"
    assert job.payload["training_data"]["source"] == "inline"
    assert job.payload["training_data"]["rows"] == 2  # the blank line is no group
    assert json.loads(Path(job.payload["snapshot_path"]).read_text().splitlines()[0]) == GROUP
    assert Adapter.objects.get(name="math-r001").state == "writing"

    page = operator_client.get(response["Location"]).content.decode()
    assert 'id="training-section"' in page and "waiting for the first optimizer step" in page
    assert "math-r001" in page and "/ui/adapters/math-r001/" in page


def test_a_server_path_and_the_auto_load_box(operator_client, tmp_path):
    path = tmp_path / "rollouts.jsonl"
    path.write_text(json.dumps(GROUP) + "\n")
    response = operator_client.post("/ui/training/grpo/", _form(output_name="from-path", dataset_path=str(path),
                                                                 auto_load="on"))
    assert response.status_code == 302
    job = Job.objects.get()
    assert job.payload["training_data"]["source"] == "dataset_path"
    assert job.payload["config"]["auto_load"] is True


def test_base_adapter_select_lists_published_adapters_only(operator_client, operator, tmp_path):
    job = _submit(operator, "math-r001")
    adapter_publish(name="math-r001", path=tmp_path, content_sha256="sha256:" + "a" * 64,
                    base_model_sha256="", loaded=False)
    _submit(operator, "still-writing")
    html = operator_client.get("/ui/training/grpo/").content.decode()
    assert '<option value="math-r001">math-r001</option>' in html
    assert '<option value="still-writing">' not in html
    response = operator_client.post("/ui/training/grpo/", _form(output_name="math-r002", base_adapter="math-r001",
                                                                 jsonl_file=_jsonl(GROUP)))
    assert response.status_code == 302, response.content.decode()[:2000]
    second = Job.objects.exclude(id=job.id).exclude(payload__adapter_name="still-writing").get()
    assert second.payload["config"]["base_adapter"] == "math-r001"


NAN_GROUP = '{"messages": [{"role": "user", "content": "2+3?"}], "completions": [{"text": "5", "reward": NaN}]}'


@pytest.mark.parametrize("fields, field, code, text", [
    ({"jsonl_file": "nan"}, "jsonl_file", "training_invalid_request", "groups[0].completions[0].reward: must be finite"),
    ({"jsonl_file": "ok", "dataset_path": "/tmp/other.jsonl"}, "source", "training_invalid_request",
     "got groups, dataset_path"),
    ({}, "source", "training_invalid_request", "got none"),
    ({"jsonl_file": "ok", "output_name": "bad name!"}, "output_name", "invalid_adapter_name",
     "is not a valid adapter name"),
    ({"jsonl_file": "ok", "output_name": "../etc"}, "output_name", "training_invalid_request", "not a path"),
    ({"jsonl_file": "broken"}, "jsonl_file", "training_invalid_request", "line 2 is not valid JSON"),
    ({"jsonl_file": "empty"}, "jsonl_file", "training_invalid_request", "groups: must be a non-empty list"),
    ({"dataset_path": "relative/groups.jsonl"}, "dataset_path", "training_invalid_request", "absolute path"),
    ({"jsonl_file": "ok", "lora_rank": "sixteen"}, "lora_rank", "training_invalid_request", "config.lora_rank"),
    ({"jsonl_file": "ok", "kl_coeff": "-1"}, "kl_coeff", "training_invalid_request", "config.kl_coeff: must be >= 0"),
    ({"jsonl_file": "ok", "behavior_policy": "recorded"}, "behavior_policy", "training_invalid_request",
     "needs provenance on every rollout"),
    ({"jsonl_file": "ok", "base_adapter": "never-trained"}, "base_adapter", "training_invalid_request",
     "no published adapter named"),
    ({"jsonl_file": "ok", "advanced_config": "{not json"}, "advanced_config", "training_invalid_request",
     "not valid JSON"),
    ({"jsonl_file": "ok", "advanced_config": "[1]"}, "advanced_config", "training_invalid_request",
     "must be a JSON object"),
    ({"jsonl_file": "ok", "advanced_config": '{"is_level": "banana"}'}, "advanced_config",
     "training_invalid_request", "config.is_level"),
])
def test_invalid_input_rerenders_with_the_error_next_to_its_field_and_queues_nothing(
        operator_client, fields, field, code, text):
    uploads = {"nan": _jsonl(NAN_GROUP), "ok": _jsonl(GROUP), "broken": _jsonl(GROUP, "{oops"),
               "empty": _jsonl("", "")}
    fields = dict(fields)
    if "jsonl_file" in fields:
        fields["jsonl_file"] = uploads[fields["jsonl_file"]]
    response = operator_client.post("/ui/training/grpo/", _form(**{"output_name": "math-r001", **fields}))
    assert response.status_code == 400
    html = response.content.decode()
    assert 'id="form-error"' in html and "Nothing was queued." in html
    error = html[html.index(f'id="error-{field}"'):]
    error = error[:error.index("</p>")]
    assert f"<code>{code}</code>" in error
    assert text in unescape(error), error
    assert html.count('class="field-error"') == 1
    # The form keeps what was typed (except the file, which browsers never re-send).
    assert f'value="{escape(fields.get("output_name", "math-r001"))}"' in html
    assert Job.objects.count() == 0 and Adapter.objects.count() == 0


def test_a_used_output_name_is_a_conflict_on_that_field(operator_client, operator):
    _submit(operator, "math-r001")
    response = operator_client.post("/ui/training/grpo/", _form(output_name="math-r001", jsonl_file=_jsonl(GROUP)))
    assert response.status_code == 409
    html = response.content.decode()
    assert 'id="error-output_name"' in html and "<code>adapter_revision_conflict</code>" in html
    assert "math-r002" in html  # the hint
    assert Job.objects.count() == 1


def test_a_user_without_submit_job_is_refused(viewer_client):
    page = viewer_client.get("/ui/training/grpo/").content.decode()
    assert 'id="needs-permission"' in page and '<fieldset disabled class="plain">' in page
    response = viewer_client.post("/ui/training/grpo/", _form(output_name="math-r001", jsonl_file=_jsonl(GROUP)))
    assert response.status_code == 403
    assert "You lack the submit_job permission" in response.content.decode()
    assert Job.objects.count() == 0 and Adapter.objects.count() == 0


def test_the_form_needs_login_and_csrf(client, operator):
    from django.test import Client

    response = client.post("/ui/training/grpo/", _form(output_name="x", jsonl_file=_jsonl(GROUP)))
    assert response.status_code == 302 and response["Location"].startswith("/ui/login/")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator)
    assert strict.post("/ui/training/grpo/", _form(output_name="x", jsonl_file=_jsonl(GROUP))).status_code == 403
    assert Job.objects.count() == 0


# ---- the queue --------------------------------------------------------------------------------

def test_queue_shows_running_queued_with_positions_and_finished(operator_client, operator):
    running = _submit(operator, "run-1")
    first, second = _submit(operator, "wait-1"), _submit(operator, "wait-2")
    gone = _submit(operator, "gone-1")
    job_services.job_cancel(job=gone, user=operator)
    claimed = job_services.job_claim_next(queue="gpu", worker_id="gpu-worker")
    assert claimed.id == running.id
    job_services.job_report_progress(job=claimed, progress=0.25, message="group 1/4", metrics={"loss": 0.123456})
    html = operator_client.get("/ui/training/grpo/").content.decode()

    def body(tbody_id):
        part = html[html.index(f'id="{tbody_id}"'):]
        return part[:part.index("</tbody>")]

    run = body("queue-running")
    assert f'/ui/jobs/{running.uuid}/' in run and "run-1" in run and "0.1235" in run
    assert '<span class="pct">25%</span>' in run
    queued = body("queue-queued")
    assert queued.index(f"queue-row-{first.uuid}") < queued.index(f"queue-row-{second.uuid}")
    assert "#1" in queued and "#2" in queued and f'/ui/jobs/{second.uuid}/' in queued
    finished = body("queue-finished")
    assert f"queue-row-{gone.uuid}" in finished and 'badge state-cancelled">cancelled<' in finished
    assert "never started" in finished


# ---- the training section of a job page -----------------------------------------------------

def _running_training_job(user, name="math-r001"):
    job = _submit(user, name)
    claimed = job_services.job_claim_next(queue="gpu", worker_id="gpu-worker")
    assert claimed.id == job.id
    return claimed


def _metrics(steps: int) -> dict:
    return {
        "loss": 0.25, "step": steps, "total_steps": 40, "kept_groups": 9, "filtered_groups": 3,
        "loss_history": [{"step": s, "loss": 1 / s} for s in range(1, steps + 1)],
        "reward_history": [{"step": s, "reward_mean": s / 10} for s in range(1, steps)],
        "kl_history": [{"step": s, "kl_mean": 0.01 * s} for s in range(1, 3)]
                      + [{"step": 3, "kl_mean": None}],  # JSONField cannot hold NaN: a missing value
    }


def test_job_page_draws_loss_reward_and_kl_curves_as_svg(operator_client, operator):
    job = _running_training_job(operator)
    job_services.job_report_progress(job=job, progress=0.1, message="group 6/40", metrics=_metrics(6))
    html = operator_client.get(f"/ui/jobs/{job.uuid}/").content.decode()
    assert html.count("<svg") == 3 and html.count("<polyline") == 3
    assert _polyline_points(html, "loss") == 6
    assert _polyline_points(html, "reward") == 5
    assert _polyline_points(html, "kl") == 2
    assert "1 non-finite or missing value not drawn" in html
    assert 'id="curve-loss-last">0.25<' in html
    assert "step 6 / 40" in html
    kept = html[html.index('id="training-kept"'):]
    assert kept[:kept.index("</dd>")].count("9") and "(75%)" in kept[:kept.index("</dd>")]
    assert 'id="training-filtered"><span class="mono">3</span>' in html
    # Histories are drawn, not dumped into the generic metrics card.
    metrics_card = html[html.index('id="job-metrics"'):]
    metrics_card = metrics_card[:metrics_card.index("</section>")]
    assert "loss_history" not in metrics_card and "<dt>kept_groups</dt>" in metrics_card
    assert "/v1/adapters/math-r001/receipt" not in html  # no receipt yet: no link to a 404
    assert "is written next to the adapter once the run enters its training loop" in html


def test_job_page_without_metrics_has_empty_curves(operator_client, operator):
    job = _running_training_job(operator)
    html = operator_client.get(f"/ui/jobs/{job.uuid}/").content.decode()
    assert html.count("<polyline") == 0 and html.count("No points yet") == 3


RECEIPT = {
    "schema_version": 1, "receipt_type": "kiln_train_receipt", "adapter_name": "math-r001",
    "produced_at": "2025-01-01T00:00:00Z", "status": "success", "failure_reason": None, "failure_message": None,
    "grpo": {"kl_coeff": 0.1, "behavior_policy": "no_importance_correction", "dynamic_groups_filtered": 3,
             "policy_audit": {"schema": "kiln.grpo-policy-audit.v1",
                              "importance_sampling": {"ratio_scope": "token", "action_tokens": 512,
                                                      "mean_ratio": 1.0, "above_clip_count": 0},
                              "kl_reference": {"token_observations": 512, "mean_estimator": 0.0123}}},
    "data": {"groups_read": 12, "groups_filtered": 3, "groups_trained": 9, "reward_groups_kept": 9},
    "rewards": {"count": 24, "mean": 0.5, "group_variance_histogram": [{"label": "0", "count": 3},
                                                                       {"label": "(0, 0.25]", "count": 9}]},
    "phase_timings": {"tokenize_ms": 12, "policy_forward_ms": 830, "backward_ms": 1650, "gpu_writer_acquisitions": 4},
    "runtime": {"wall_clock_ms": 4321},
}


def _published_with_receipt(user, tmp_path, receipt_text: str):
    job = _running_training_job(user)
    adapter_dir = tmp_path / "math-r001"
    adapter_dir.mkdir()
    (adapter_dir / "train_receipt.json").write_text(receipt_text)
    adapter_publish(name="math-r001", path=adapter_dir, content_sha256="sha256:" + "ab" * 32,
                    base_model_sha256="sha256:" + "cd" * 32, loaded=True)
    job_services.job_complete(job=job, result={"adapter_path": str(adapter_dir)})
    return job


def test_job_page_shows_adapter_and_receipt_blocks(operator_client, operator, tmp_path):
    job = _published_with_receipt(operator, tmp_path, json.dumps(RECEIPT))
    html = operator_client.get(f"/ui/jobs/{job.uuid}/").content.decode()
    assert str(tmp_path / "math-r001") in html
    assert 'badge adapter-published">published<' in html and "sha256:abababababab" in html
    assert 'id="receipt-link">/v1/adapters/math-r001/receipt<' in html
    for text in ("kiln.grpo-policy-audit.v1", "Importance sampling", "<dt>action_tokens</dt>", "0.0123",
                 "Phase timings", "backward", "1.65 s", "4.32 s", "<dt>groups_trained</dt>",
                 "Group reward variance", "(0, 0.25]"):
        assert text in html, text
    assert 'badge receipt-success">success<' in html


def test_a_half_written_receipt_does_not_break_the_pages(operator_client, operator, tmp_path):
    job = _published_with_receipt(operator, tmp_path, '{"schema_version": 1, "rece')
    html = operator_client.get(f"/ui/jobs/{job.uuid}/").content.decode()
    assert "the training receipt could not be read yet" in html and 'id="training-section"' in html
    adapter = operator_client.get("/ui/adapters/math-r001/")
    # the adapter page shows what GET /v1/adapters/{name}/receipt answers: a receipt that is not JSON fails its check
    assert adapter.status_code == 200 and "receipt_integrity_failed" in adapter.content.decode()
    assert "is not JSON any more" in adapter.content.decode()
    api = operator_client.get(f"/v1/train/jobs/{job.uuid}")  # the API reads it as not there yet, not a 500
    assert api.status_code == 200 and api.json()["train_receipt"] is None and api.json()["job_id"] == str(job.uuid)
    assert api.json()["metadata_error"].startswith("train_receipt.json could not be read (JSONDecodeError")


def test_a_failed_jobs_page_does_not_claim_a_later_jobs_adapter(operator_client, operator, tmp_path):
    """A failed run releases its output name; another job may publish under it. The failed job's
    page must not show that adapter, its digest or its receipt link as its own output."""
    from adapters.services import adapter_release

    failed = _running_training_job(operator)
    failed_receipt = {**RECEIPT, "status": "failed", "failure_reason": "zero_groups",
                      "data": {"groups_read": 4, "groups_filtered": 4, "groups_trained": 0}}
    job_services.job_fail(job=failed, code="zero_groups", message="every group was filtered",
                          result={"train_receipt": failed_receipt})
    adapter_release(name="math-r001", reason="the run failed")
    later = _published_with_receipt(operator, tmp_path, json.dumps(RECEIPT))
    assert later.id != failed.id
    html = operator_client.get(f"/ui/jobs/{failed.uuid}/").content.decode()
    section = html[html.index('id="training-adapter"'):]
    section = section[:section.index("</dd>")]
    assert 'badge adapter-published' not in section and "another job's adapter now" in section
    assert "sha256:abababababab" not in html
    assert "/v1/adapters/math-r001/receipt" not in html
    # Its own page still shows the adapter as its output.
    own = operator_client.get(f"/ui/jobs/{later.uuid}/").content.decode()
    assert 'badge adapter-published">published<' in own and "/v1/adapters/math-r001/receipt" in own


def test_kept_and_filtered_groups_come_from_the_receipt_when_no_step_ran(operator_client, operator, tmp_path):
    job = _published_with_receipt(operator, tmp_path, json.dumps(RECEIPT))  # no progress was reported
    html = operator_client.get(f"/ui/jobs/{job.uuid}/").content.decode()
    kept = html[html.index('id="training-kept"'):]
    kept = kept[:kept.index("</dd>")]
    assert '<span class="mono">9</span>' in kept and "(75%)" in kept
    assert 'id="training-filtered"><span class="mono">3</span>' in html


# ---- adapters ---------------------------------------------------------------------------------

def test_adapters_page_lists_rows(operator_client, operator, tmp_path):
    job = _published_with_receipt(operator, tmp_path, json.dumps(RECEIPT))
    writing = _submit(operator, "math-r002", base_adapter="math-r001")
    html = operator_client.get("/ui/adapters/").content.decode()
    assert 'id="adapters-empty"' not in html
    row = html[html.index('id="adapter-row-math-r001"'):]
    row = row[:row.index("</tr>")]
    assert 'badge adapter-published">published<' in row and 'class="ok">loaded<' in row
    assert "sha256:abababababab" in row and f"/ui/jobs/{job.uuid}/" in row
    assert 'href="/ui/adapters/math-r001/"' in row
    row2 = html[html.index('id="adapter-row-math-r002"'):]
    row2 = row2[:row2.index("</tr>")]
    assert 'badge adapter-writing">writing<' in row2 and f"/ui/jobs/{writing.uuid}/" in row2
    assert 'href="/ui/adapters/math-r001/">math-r001</a>' in row2  # started from
    assert html.index("adapter-row-math-r002") < html.index("adapter-row-math-r001")  # newest first


def test_adapters_page_empty_state(operator_client):
    html = operator_client.get("/ui/adapters/").content.decode()
    assert 'id="adapters-empty"' in html and "No adapters yet" in html and "<table" not in html


def test_adapter_detail_shows_its_receipt_json(operator_client, operator, tmp_path):
    _published_with_receipt(operator, tmp_path, json.dumps(RECEIPT))
    html = operator_client.get("/ui/adapters/math-r001/").content.decode()
    assert "sha256:" + "ab" * 32 in html and "sha256:" + "cd" * 32 in html
    assert '<details class="receipt-raw" open>' in html
    assert "&quot;receipt_type&quot;: &quot;kiln_train_receipt&quot;" in html
    assert 'href="/v1/adapters/math-r001/receipt"' in html
    assert operator_client.get("/v1/adapters/math-r001/receipt").json()["status"] == "success"


def test_adapter_detail_without_receipt_and_unknown_adapter(operator_client, operator):
    _submit(operator, "math-r001")
    html = operator_client.get("/ui/adapters/math-r001/").content.decode()
    assert "No <span class=\"mono\">train_receipt.json</span> yet" in html
    assert "/v1/adapters/math-r001/receipt" not in html
    assert operator_client.get("/ui/adapters/nope/").status_code == 404


@pytest.mark.parametrize("name", ["ui:adapters", "ui:training_grpo"])
def test_training_pages_need_login(client, name):
    from django.urls import reverse

    url = reverse(name)
    assert client.get(url)["Location"] == f"/ui/login/?next={url}"
    assert client.get("/ui/adapters/x/").status_code == 302


# ---- sparkline geometry -------------------------------------------------------------------------

def test_sparkline_geometry():
    line = sparkline([{"step": 1, "loss": 2.0}, {"step": 3, "loss": 0.0}, {"step": 2, "loss": 1.0}], "loss")
    assert line.points == "4.0,4.0 160.0,42.0 316.0,80.0"  # sorted by step, top is the highest value
    assert (line.count, line.total, line.skipped, line.last, line.low, line.high) == (3, 3, 0, 0.0, 0.0, 2.0)
    single = sparkline([{"step": 5, "loss": 0.3}], "loss")
    assert single.points == "160.0,42.0" and single.count == 1
    assert sparkline(None, "loss").count == 0 and sparkline([{"step": 1}], "loss").skipped == 1
    crossing = sparkline([{"step": 0, "kl_mean": -1.0}, {"step": 1, "kl_mean": 1.0}], "kl_mean")
    assert crossing.zero_y == 42.0
    assert sparkline([{"step": 1, "loss": math.inf}, {"step": 2, "loss": True}], "loss").count == 0


def test_long_histories_are_thinned_but_keep_spikes_and_the_newest_point():
    history = [{"step": s, "loss": 1.0} for s in range(5000)]
    history[2345]["loss"] = 50.0
    history[-1]["loss"] = 0.5
    line = sparkline(history, "loss", max_points=200)
    assert line.count <= 200 and line.thinned and line.total == 5000
    ys = [float(p.split(",")[1]) for p in line.points.split()]
    assert min(ys) == 4.0  # the spike (highest value) is drawn at the top
    assert line.last == 0.5 and line.points.split()[-1] == f"{line.last_x},{line.last_y}"


@pytest.mark.parametrize(("post_eval", "approval", "said"), [
    (None, False, "yes: served once published"),
    (None, True, "yes: once published, a promotion request a reviewer approves"),
    ({"suite": "held", "min_accuracy": 0.5}, False, "yes, if the post-eval gate passes (floor 0.5)"),
    ({"suite": "held", "min_accuracy": 0.5}, True, "yes, if the post-eval gate passes (floor 0.5); then a reviewer approves it"),
    ({"suite": "held"}, False, "yes: served once published"),  # an eval without a floor decides nothing
])
def test_the_auto_load_line_says_what_decides_activation(operator_client, operator, settings, post_eval, approval, said):
    """It said "served once published" for a run whose gate decides, or a reviewer."""
    from dataclasses import replace

    from evaluations.suite_services import suite_store

    suite_store(body={"name": "held", "scorer": {"type": "exact"},
                      "examples": [{"id": "e1", "messages": [{"role": "user", "content": "What is 9 + 9?"}],
                                    "target": "18"}]})
    settings.KILN = replace(settings.KILN, promotion_require_approval=approval)
    job, _ = grpo_submit(body={"groups": [GROUP], "config": {"output_name": "auto-r001", "auto_load": True},
                               "post_eval": post_eval}, user=operator)
    html = operator_client.get(f"/ui/jobs/{job.uuid}/").content.decode()
    line = html[html.index('id="training-auto-load">') + len('id="training-auto-load">'):]
    assert " ".join(unescape(line[:line.index("</dd>")]).split()) == said


def test_a_step_that_cannot_fit_is_refused_on_the_page_with_the_estimate_and_the_knobs(
    operator_client, settings, tmp_path
):
    """413 training_will_not_fit reaches the form as it reaches the API: the estimate against the
    budget, what to turn down, and nothing queued."""
    import dataclasses
    import shutil

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps(
        {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
         "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936}))
    shutil.copy(Path(__file__).resolve().parents[2] / "gpu_runtime/assets/kiln-tiny/tokenizer.json", model)
    settings.KILN = dataclasses.replace(settings.KILN, model_path=model, training_memory_budget_mib=64)
    response = operator_client.post("/ui/training/grpo/", _form(output_name="big-r001", jsonl_file=_jsonl(GROUP)))
    assert response.status_code == 413
    html = unescape(response.content.decode())
    assert "<code>training_will_not_fit</code>" in html and "Nothing was queued." in html
    assert "allows 64 MiB" in html and "grad_checkpoint_segments" in html
    assert not Job.objects.exists() and not Adapter.objects.filter(name="big-r001").exists()


def test_a_small_lora_rank_keeps_the_default_alpha_ratio(operator_client):
    """Rank 8 from the form was refused unsafe_lora_scale (the default alpha 32 over 8); the form keeps
    alpha at twice the rank, as the CLI's --lora-rank does, unless the advanced JSON sets it."""
    response = operator_client.post("/ui/training/grpo/", _form(output_name="r8-r001", lora_rank="8",
                                                                jsonl_file=_jsonl(GROUP)))
    assert response.status_code == 302, unescape(response.content.decode())[:2000]
    config = Job.objects.get().payload["config"]
    assert (config["lora_rank"], config["lora_alpha"]) == (8, 16)
    response = operator_client.post("/ui/training/grpo/", _form(output_name="r8-r002", lora_rank="8",
                                                                advanced_config='{"lora_alpha": 8}',
                                                                jsonl_file=_jsonl(GROUP)))
    assert response.status_code == 302
    assert Job.objects.get(payload__config__output_name="r8-r002").payload["config"]["lora_alpha"] == 8


def test_the_job_page_says_what_the_queued_answer_warned_of(operator_client):
    """A misspelt advanced key was accepted and ignored with no word on the page the form lands on."""
    response = operator_client.post("/ui/training/grpo/", _form(output_name="typo-r001",
                                                                advanced_config='{"lerning_rate": 0.1}',
                                                                jsonl_file=_jsonl(GROUP)))
    assert response.status_code == 302
    page = unescape(operator_client.get(response["Location"]).content.decode())
    assert 'id="training-warnings"' in page
    assert "config.lerning_rate is not a GRPO config field and was ignored (did you mean learning_rate?)" in page
    clean = operator_client.post("/ui/training/grpo/", _form(output_name="clean-r001", jsonl_file=_jsonl(GROUP)))
    assert 'id="training-warnings"' not in operator_client.get(clean["Location"]).content.decode()


def test_blank_fields_say_what_the_server_defaults_give(operator_client, settings):
    """The learning rate read "auto (optimizer default)" while the demo's [training.defaults] gave 3e-5."""
    import dataclasses

    html = operator_client.get("/ui/training/grpo/").content.decode()
    assert 'placeholder="auto (optimizer default)"' in html and 'placeholder="16"' in html
    settings.KILN = dataclasses.replace(settings.KILN, training_defaults={"learning_rate": 3e-5, "lora_rank": 8})
    html = operator_client.get("/ui/training/grpo/").content.decode()
    assert 'placeholder="3e-05 (server default)"' in html and 'placeholder="8 (server default)"' in html
    assert 'placeholder="0.1"' in html  # kl_coeff: not set by the server
