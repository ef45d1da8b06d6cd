"""Dashboard pages through Django's test client: login, real values on every page, cancel by POST."""

from __future__ import annotations

import pytest
from django.urls import reverse

from core.jobs import services
from core.jobs.models import JobState

PAGES = ["ui:overview", "ui:jobs", "ui:training_grpo", "ui:training_openenv", "ui:adapters",
         "ui:evaluations", "ui:promotions"]


def _running(job):
    """Claim the job as a worker would, so it is running."""
    claimed = services.job_claim_next(queue=job.queue, worker_id="test-worker")
    assert claimed is not None and claimed.id == job.id
    return claimed


@pytest.mark.django_db
@pytest.mark.parametrize("name", PAGES + ["ui:job_detail"])
def test_every_page_requires_login(client, name):
    kwargs = {"job_id": "00000000-0000-0000-0000-000000000000"} if name == "ui:job_detail" else {}
    url = reverse(name, kwargs=kwargs)
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"] == f"/ui/login/?next={url}"


@pytest.mark.django_db
def test_login_form_logs_in_and_logout_is_a_post(client, operator):
    page = client.get("/ui/login/")
    assert page.status_code == 200
    assert b'name="csrfmiddlewaretoken"' in page.content
    bad = client.post("/ui/login/", {"username": "operator", "password": "wrong-password"})
    assert bad.status_code == 200
    assert b"didn't match" in bad.content
    good = client.post("/ui/login/", {"username": "operator", "password": "correct-horse-42", "next": "/ui/jobs/"})
    assert good.status_code == 302 and good["Location"] == "/ui/jobs/"
    assert client.get("/ui/").status_code == 200
    out = client.post("/ui/logout/")
    assert out.status_code == 302 and out["Location"] == "/ui/login/"
    assert client.get("/ui/").status_code == 302


@pytest.mark.django_db
@pytest.mark.parametrize("name", PAGES)
def test_each_page_renders_for_a_logged_in_user(operator_client, name):
    response = operator_client.get(reverse(name))
    assert response.status_code == 200
    html = response.content.decode()
    assert "operator" in html  # the user in the header
    assert 'profile: <strong>stable</strong>' in html  # the serving profile in the header
    for label in ("Overview", "Training", "GRPO", "OpenEnv", "Adapters", "Evaluations", "Promotions", "Jobs"):
        assert f">{label}</a>" in html


@pytest.mark.django_db
def test_overview_shows_counts_health_and_recent_jobs(operator_client, operator):
    queued = services.job_submit(kind="test.steps", payload={"steps": 3}, user=operator, title="first")
    services.job_submit(kind="test.steps", payload={"steps": 3}, user=operator)
    cancelled = services.job_submit(kind="test.control_steps", payload={}, user=operator)
    services.job_cancel(job=cancelled, user=operator)
    html = operator_client.get("/ui/").content.decode()
    assert '<a class="count state-queued" href="/ui/jobs/?state=queued" id="count-queued">\n      <span class="n">2</span>' in html
    assert 'id="count-cancelled">\n      <span class="n">1</span>' in html
    assert f'id="job-row-{queued.uuid}"' in html
    # The health summary is the real report: no worker runs in this test, the broker is absent.
    assert "No worker has sent a heartbeat" in html
    assert "no GPU worker is running" in html
    assert 'id="health-status">unavailable<' in html
    assert "kiln-test-model-not-loaded is not a directory" in html  # tests/settings.py's placeholder model


@pytest.mark.django_db
def test_jobs_page_lists_jobs_with_state_progress_and_submitter(operator_client, operator):
    job = _running(services.job_submit(kind="test.steps", payload={"steps": 3}, user=operator, title="gated"))
    services.job_report_progress(job=job, progress=2 / 3, message="step 2/3")
    html = operator_client.get("/ui/jobs/").content.decode()
    assert 'ws-connect="/ws/ui/jobs/"' in html
    row = html[html.index(f'id="job-row-{job.uuid}"'):]
    row = row[:row.index("</tr>")]
    assert str(job.uuid)[:8] in row
    assert "test.steps" in row and "gated" in row
    assert 'badge state-running">running<' in row
    assert '<span class="pct">67%</span>' in row
    assert "step 2/3" in row
    assert "operator" in row


@pytest.mark.django_db
def test_jobs_page_empty_state(operator_client):
    html = operator_client.get("/ui/jobs/").content.decode()
    assert "No jobs yet." in html


@pytest.mark.django_db
def test_category_pages_list_only_their_jobs_and_explain_how_work_arrives(operator_client, operator):
    training = services.job_submit(kind="test.steps", payload={}, user=operator)
    openenv = services.job_submit(kind="test.control_steps", payload={}, user=operator)
    grpo = operator_client.get("/ui/training/grpo/").content.decode()
    # The GRPO page lists its own queue of training.grpo jobs (tests/ui/test_training_pages.py).
    assert f"{training.uuid}" not in grpo and f"{openenv.uuid}" not in grpo
    assert 'ws-connect="/ws/ui/training/queue/"' in grpo and "No GRPO training is running." in grpo
    assert "/v1/train/grpo" in grpo
    env = operator_client.get("/ui/training/openenv/").content.decode()
    assert f"job-row-{openenv.uuid}" in env and f"job-row-{training.uuid}" not in env
    evals = operator_client.get("/ui/evaluations/").content.decode()
    assert "No evaluation jobs yet." in evals and "job-row-" not in evals
    assert "appears here once a GRPO training job finishes" in operator_client.get("/ui/adapters/").content.decode()
    assert "Nothing to decide" in operator_client.get("/ui/promotions/").content.decode()


@pytest.mark.django_db
def test_job_detail_shows_state_metrics_payload_and_events(operator_client, operator):
    job = _running(services.job_submit(kind="test.steps", payload={"steps": 3, "note": "hi"}, user=operator))
    services.job_report_progress(job=job, progress=1 / 3, message="step 1/3", metrics={"step": 1, "loss": 0.25})
    response = operator_client.get(f"/ui/jobs/{job.uuid}/")
    assert response.status_code == 200
    html = response.content.decode()
    assert f'ws-connect="/ws/ui/jobs/{job.uuid}/"' in html
    assert 'badge state-running">running<' in html
    assert '<span class="pct">33%</span>' in html and "step 1/3" in html
    assert "<dt>loss</dt>" in html and "0.25" in html
    assert "&quot;note&quot;: &quot;hi&quot;" in html  # the payload, as escaped JSON
    for event in ("queued", "running", "progress"):
        assert f'badge event">{event}<' in html
    assert 'id="cancel-job"' in html
    assert operator_client.get("/ui/jobs/11111111-1111-1111-1111-111111111111/").status_code == 404


@pytest.mark.django_db
def test_failed_job_page_shows_error_and_no_cancel_button(operator_client, operator):
    job = _running(services.job_submit(kind="test.fail", payload={}, user=operator))
    services.job_fail(job=job, code="test_failure", message="boom", result={"partial": True})
    html = operator_client.get(f"/ui/jobs/{job.uuid}/").content.decode()
    assert "<code>test_failure</code>" in html and "boom" in html
    assert "&quot;partial&quot;: true" in html
    assert 'id="cancel-job"' not in html


@pytest.mark.django_db
def test_cancel_post_cancels_a_queued_job(operator_client, operator):
    job = services.job_submit(kind="test.steps", payload={}, user=operator)
    response = operator_client.post(f"/ui/jobs/{job.uuid}/cancel/", follow=True)
    assert response.redirect_chain == [(f"/ui/jobs/{job.uuid}/", 302)]
    job.refresh_from_db()
    assert job.state == JobState.CANCELLED
    html = response.content.decode()
    assert "cancelled before it started" in html
    assert 'badge state-cancelled">cancelled<' in html
    assert 'id="cancel-job"' not in html


@pytest.mark.django_db
def test_cancel_post_on_a_running_job_requests_cancellation(operator_client, operator):
    job = _running(services.job_submit(kind="test.steps", payload={}, user=operator))
    html = operator_client.post(f"/ui/jobs/{job.uuid}/cancel/", follow=True).content.decode()
    job.refresh_from_db()
    assert job.state == JobState.RUNNING and job.cancel_requested
    assert "Cancellation requested" in html and "cancel requested" in html


@pytest.mark.django_db
def test_cancel_of_a_finished_job_shows_the_service_error(operator_client, operator):
    job = services.job_submit(kind="test.steps", payload={}, user=operator)
    services.job_cancel(job=job, user=operator)
    html = operator_client.post(f"/ui/jobs/{job.uuid}/cancel/", follow=True).content.decode()
    assert f"job {job.uuid} is already cancelled" in html
    assert 'class="message error"' in html


@pytest.mark.django_db
def test_cancel_is_refused_without_the_permission(viewer_client, operator):
    job = services.job_submit(kind="test.steps", payload={}, user=operator)
    page = viewer_client.get(f"/ui/jobs/{job.uuid}/").content.decode()
    assert 'id="cancel-job"' not in page and "needs the submit_job permission" in page
    response = viewer_client.post(f"/ui/jobs/{job.uuid}/cancel/")
    assert response.status_code == 403
    assert "You lack the submit_job permission" in response.content.decode()
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


@pytest.mark.django_db
def test_cancel_needs_post_and_csrf(operator, operator_client):
    from django.test import Client

    job = services.job_submit(kind="test.steps", payload={}, user=operator)
    back = operator_client.get(f"/ui/jobs/{job.uuid}/cancel/")  # a reloaded form action: its page, no cancel
    assert (back.status_code, back["Location"]) == (302, f"/ui/jobs/{job.uuid}/")
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator)
    assert strict.post(f"/ui/jobs/{job.uuid}/cancel/").status_code == 403
    job.refresh_from_db()
    assert job.state == JobState.QUEUED


def test_web_modules_do_not_import_torch():
    """The dashboard's views and consumers load without torch, transformers, peft or gpu_runtime."""
    import subprocess
    import sys

    code = (
        "import django, sys; django.setup();"
        "import kiln_project.ui.views, kiln_project.ui.consumers, kiln_project.ui.routing, kiln_project.asgi;"
        "bad = [m for m in ('torch', 'transformers', 'peft', 'gpu_runtime') if m in sys.modules];"
        "print(bad); sys.exit(1 if bad else 0)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env={**__import__("os").environ, "DJANGO_SETTINGS_MODULE": "tests.settings"})
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.django_db
def test_overview_shows_what_the_metrics_counted(operator_client):
    from core.metrics.services import counter_add

    html = operator_client.get("/ui/").content.decode()
    assert '<span class="count-completed">0 completed</span>' in html and html.count("none yet") == 2
    counter_add("kiln_inference_requests_total", 3, outcome="completed")
    counter_add("kiln_inference_requests_total", outcome="abandoned")
    counter_add("kiln_inference_completion_tokens_total", 41)
    counter_add("kiln_gate_decisions_total", 2, gate="environment", outcome="rejected")
    counter_add("kiln_gate_decisions_total", gate="post_eval", outcome="promoted")
    counter_add("kiln_openenv_runs_total", 4, status="accepted")
    counter_add("kiln_openenv_runs_total", status="idempotent_replay")
    counter_add("kiln_openenv_episode_terminations_total", 30, termination="done")
    counter_add("kiln_openenv_episode_terminations_total", 2, termination="max_steps")
    html = operator_client.get("/ui/").content.decode()
    assert '<span class="count-completed">3 completed</span>' in html
    assert '<span class="count-abandoned">1 abandoned</span>' in html and "(41 tokens generated)" in html
    assert '<span class="badge">2 rejected</span>' in html and '<span class="badge">1 promoted</span>' in html
    assert "4 runs accepted" in html and "(1 retry answered from the idempotency key)" in html
    assert "32 episodes published" in html and "0 failed runs" in html and "none yet" not in html


def test_a_missing_page_and_a_refused_form_are_dashboard_pages(operator_client, operator, client):
    """Django's bare "Not Found" and "Forbidden (403) CSRF verification failed" pages had no navigation
    and no word on what to do."""
    from django.test import Client

    for url in ("/ui/adapters/no-such-adapter/", "/ui/promotions/999999/", "/ui/no-such-page/"):
        response = operator_client.get(url)
        html = response.content.decode()
        assert response.status_code == 404, url
        assert "<h1>Not found</h1>" in html and '<code id="request-error-code">not_found</code>' in html, url
        assert 'href="/ui/jobs/"' in html  # the navigation is there
    assert client.get("/ui/no-such-page/").status_code == 404  # anonymous too, without a traceback
    assert client.get("/v1/no-such-route").json()["error"]["code"] == "not_found"  # the API keeps its envelope
    strict = Client(enforce_csrf_checks=True)
    strict.force_login(operator)
    refused = strict.post("/ui/evaluations/datasets/math/delete/", {"confirm": "on"})
    html = refused.content.decode()
    assert refused.status_code == 403 and "<h1>Form refused</h1>" in html
    assert '<code id="request-error-code">csrf_failed</code>' in html and "reload the page" in html


def test_the_first_tab_stop_skips_the_navigation(operator_client):
    html = operator_client.get("/ui/").content.decode()
    assert html.index('class="skip-link" href="#content"') < html.index('class="topbar"')
    assert '<main class="content" id="content" tabindex="-1">' in html


@pytest.mark.django_db
def test_another_users_job_offers_no_cancel_button_without_the_permission(operator_client, operator):
    """The button was enabled and the cancel refused only after the post."""
    from django.contrib.auth.models import Permission
    from django.test import Client

    from core.accounts.services import user_create

    someone = user_create(username="someone", password="long-enough-pw")
    job = services.job_submit(kind="test.steps", payload={}, user=someone)
    html = operator_client.get(f"/ui/jobs/{job.uuid}/").content.decode()
    assert 'id="cancel-job"' not in html and 'id="cancel-not-yours"' in html and "someone" in html
    own = services.job_submit(kind="test.steps", payload={}, user=operator)
    assert 'id="cancel-job"' in operator_client.get(f"/ui/jobs/{own.uuid}/").content.decode()
    operator.user_permissions.add(Permission.objects.get(content_type__app_label="jobs", codename="delete_others_jobs"))
    client = Client()
    client.force_login(operator)
    assert 'id="cancel-job"' in client.get(f"/ui/jobs/{job.uuid}/").content.decode()
