"""Storage grows with the work, not with its square: progress events keep only what changed, the
live curves are bounded, and job detail pages through its events."""

import json

import pytest
from django.test import Client

from core.accounts.services import token_create, user_create
from core.jobs.models import Job, JobEvent, JobState
from core.jobs.services import job_report_progress
from training.runner import MAX_HISTORY_POINTS, downsampled

pytestmark = pytest.mark.django_db


def _running_job():
    return Job.objects.create(kind="test.steps", queue="gpu", state=JobState.RUNNING)


def test_a_1000_step_run_stores_events_linear_in_its_steps():
    job = _running_job()
    history = []
    for step in range(1, 1001):
        history = downsampled(history + [{"step": step, "loss": 1.0 / step}])
        job_report_progress(job=job, progress=step / 1000, message=f"step {step}",
                            metrics={"step": step, "loss": 1.0 / step, "total_steps": 1000, "loss_history": history})
    events = JobEvent.objects.filter(job=job, type="progress")
    assert events.count() == 1000
    sizes = [len(json.dumps(e.data)) for e in events]
    assert max(sizes) < 200, max(sizes)  # no event carries the history
    assert all("loss_history" not in e.data.get("metrics", {}) for e in events)
    assert "total_steps" in events.first().data["metrics"]  # unchanged scalars are stored once
    assert all("total_steps" not in e.data["metrics"] for e in events[1:])
    row = Job.objects.get(id=job.id)
    assert len(row.metrics["loss_history"]) <= MAX_HISTORY_POINTS + 1
    assert row.metrics["loss_history"][-1]["step"] == 1000 and row.metrics["loss_history"][0]["step"] == 1


def test_job_detail_holds_the_newest_events_and_the_rest_page_through():
    user_create(username="u", password="long-enough-pw")
    api = Client(headers={"Authorization": f"Bearer {token_create(username='u')[1]}"})
    job = _running_job()
    for step in range(130):
        job_report_progress(job=job, progress=step / 130, message=f"step {step}")
    detail = api.get(f"/v1/jobs/{job.uuid}").json()
    assert detail["events_total"] == 130 and len(detail["events"]) == 50
    assert detail["events"][-1]["message"] == "step 129"
    seen, before = [], None
    while True:
        page = api.get(f"/v1/jobs/{job.uuid}/events", {"limit": 40, **({"before": before} if before else {})}).json()
        seen = [e["message"] for e in page["events"]] + seen
        before = page["next_before"]
        if before is None:
            break
    assert seen == [f"step {i}" for i in range(130)]
    assert api.get(f"/v1/jobs/{job.uuid}/events", {"limit": 0}).json()["error"]["code"] == "invalid_limit"


def test_a_job_list_row_carries_scalar_metrics_and_one_job_its_histories():
    """QA: every list row embedded its loss, reward and KL histories (90 KB a row; kiln jobs list fetched
    352 KB to print 50 lines)."""
    user_create(username="u", password="long-enough-pw")
    api = Client(headers={"Authorization": f"Bearer {token_create(username='u')[1]}"})
    job = _running_job()
    history = [{"step": step, "loss": 1.0 / step} for step in range(1, 501)]
    job_report_progress(job=job, progress=0.5, message="step 500",
                        metrics={"step": 500, "loss": 0.002, "total_steps": 1000, "loss_history": history,
                                 "reward_history": history})
    [row] = api.get("/v1/jobs").json()
    assert row["metrics"] == {"step": 500, "loss": 0.002, "total_steps": 1000}
    assert len(json.dumps(row)) < 2000
    detail = api.get(f"/v1/jobs/{job.uuid}").json()
    assert detail["metrics"]["loss_history"] == history and len(detail["metrics"]["reward_history"]) == 500


def test_the_job_page_shows_recent_events_and_links_to_the_rest(admin_client):
    job = _running_job()
    for step in range(60):
        job_report_progress(job=job, progress=step / 60, message=f"step {step}")
    page = admin_client.get(f"/ui/jobs/{job.uuid}/").content.decode()
    assert "The newest 25 of 60 events" in page and f"/ui/jobs/{job.uuid}/events/" in page
    assert page.count('class="event-progress"') == 25
    events = admin_client.get(f"/ui/jobs/{job.uuid}/events/").content.decode()
    assert events.count('class="event-progress"') == 60 and "older events" not in events
