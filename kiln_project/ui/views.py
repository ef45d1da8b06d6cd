"""Dashboard pages. Views read through selectors and write through services; no domain decisions.

Each app's own pages live in its views.py and urls.py (Training → GRPO and Rollouts in training/,
the adapter registry in adapters/).

Every page is plain server-rendered HTML that reads fine without JavaScript; live updates are an
htmx layer on top (see consumers.py). Web-facing: never imports torch or gpu_runtime.
"""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404
from django.shortcuts import redirect, render
from django.views.decorators.http import require_POST

from core.errors import KilnError
from core.jobs import fragments, selectors, services
from core.jobs.models import JobState
from kiln_project.health import health_report

RECENT_JOBS = 10


@login_required
def overview(request):
    _, health = health_report()
    counts = selectors.job_counts()
    context = {
        "counts": [(state, counts.get(state, 0)) for state in JobState.values],
        "total_jobs": sum(counts.values()),
        "health": health,
        **fragments.table_context(fragments.jobs_for_table(limit=RECENT_JOBS), limit=RECENT_JOBS),
    }
    return render(request, "ui/overview.html", context)


@login_required
def jobs(request):
    context = fragments.table_context(fragments.jobs_for_table())
    return render(request, "ui/jobs/list.html", context)


def _job_or_404(job_id):
    job = selectors.job_get(job_id=str(job_id))
    if job is None:
        raise Http404("no such job")
    return job


@login_required
def job_detail(request, job_id):
    job = _job_or_404(job_id)
    return render(request, "ui/jobs/detail.html", fragments.job_detail_context(job))


EVENTS_PAGE = 100


@login_required
def job_events(request, job_id):
    """Every event of a job, a page at a time (newest page first; ?before=<event id> for older)."""
    job = _job_or_404(job_id)
    try:
        before = int(request.GET["before"]) if request.GET.get("before") else None
    except ValueError:
        raise Http404("no such page") from None
    events, older_before = selectors.job_events_page(job=job, limit=EVENTS_PAGE, before=before)
    return render(request, "ui/jobs/events.html", {
        "job": job, "events": events, "events_total": selectors.job_event_count(job=job),
        "older_before": older_before, "is_first_page": before is None})


@login_required
@require_POST
def job_cancel(request, job_id):
    job = _job_or_404(job_id)
    if not request.user.has_perm("jobs.submit_job"):
        context = {**fragments.job_detail_context(job),
                   "forbidden": "You lack the submit_job permission, so you cannot cancel jobs. "
                                "An administrator can grant it in /admin/ (Users → permissions)."}
        return render(request, "ui/jobs/detail.html", context, status=403)
    try:
        job = services.job_cancel(job=job, user=request.user)
    except KilnError as exc:
        messages.error(request, exc.message + (f" ({exc.hint})" if exc.hint else ""))
    else:
        if job.state == JobState.CANCELLED:
            messages.success(request, "The job was cancelled before it started.")
        else:
            messages.info(request, "Cancellation requested: the job stops at its next safe point.")
    return redirect("ui:job_detail", job_id=job.uuid)
