"""Dashboard pages. Views read through selectors and write through services; no domain decisions.

Each app's own pages live in its views.py and urls.py (Training → GRPO and Rollouts in training/,
the adapter registry in adapters/).

Every page is plain server-rendered HTML that reads fine without JavaScript; live updates are an
htmx layer on top (see consumers.py). Web-facing: never imports torch or gpu_runtime.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import RequestDataTooBig
from django.http import Http404
from django.shortcuts import redirect, render
from django.views import defaults
from django.views.decorators.http import require_POST

from core.errors import KilnError
from core.jobs import fragments, selectors, services
from core.jobs.models import JobState
from kiln_project.health import health_report

RECENT_JOBS = 10


def _activity() -> dict:
    """What the metrics' counters say (the numbers GET /metrics gives Prometheus), for the overview."""
    from core.metrics.selectors import counter_by_label, counter_total

    def decided(gate: str) -> list[tuple[str, int]]:
        totals = counter_by_label("kiln_gate_decisions_total", "outcome", gate=gate)
        return [(outcome, int(value)) for outcome, value in sorted(totals.items()) if value]

    requests = counter_by_label("kiln_inference_requests_total", "outcome")
    submissions = counter_by_label("kiln_openenv_runs_total", "status")
    return {
        "inference": [(outcome, int(requests.get(outcome, 0))) for outcome in ("completed", "failed", "abandoned")],
        "completion_tokens": int(counter_total("kiln_inference_completion_tokens_total")),
        "gates": [("held-out post-eval", decided("post_eval")), ("OpenEnv environment", decided("environment"))],
        "openenv_runs": int(submissions.get("accepted", 0)),
        "openenv_replays": int(submissions.get("idempotent_replay", 0)),
        "openenv_episodes": int(counter_total("kiln_openenv_episode_terminations_total")),
        "openenv_failures": int(counter_total("kiln_openenv_run_failures_total")),
    }


@login_required
def overview(request):
    _, health = health_report()
    counts = selectors.job_counts()
    context = {
        "counts": [(state, counts.get(state, 0)) for state in JobState.values],
        "total_jobs": sum(counts.values()),
        "health": health,
        "activity": _activity(),
        **fragments.table_context(fragments.jobs_for_table(limit=RECENT_JOBS), limit=RECENT_JOBS),
    }
    return render(request, "ui/overview.html", context)


@login_required
def jobs(request):
    """Every job, newest first, a page at a time: `?state=<state>` keeps one state, `?before=<job id>`
    gives the page of jobs older than that job. Only the first page follows new jobs live."""
    state = request.GET.get("state", "").strip()
    context: dict = {"states": JobState.values, "state": state, "page_size": fragments.DEFAULT_LIMIT}
    if state and state not in JobState.values:
        context["state_error"] = KilnError(
            "invalid_state", f"there is no job state {state!r}",
            hint=f"choose one of {', '.join(JobState.values)}, or show all jobs", status=400)
        return render(request, "ui/jobs/list.html", {**context, "state": ""}, status=400)
    before = None
    if request.GET.get("before"):
        before = selectors.job_get(job_id=request.GET["before"])
        if before is None:
            raise Http404("no such page")
    jobs_shown, oldest = fragments.jobs_page(state=state or None, before=before)
    context.update(fragments.table_context(jobs_shown, state=state or None, live=before is None),
                   older_before=oldest.uuid if oldest is not None else None, is_first_page=before is None,
                   state_query=f"state={state}&" if state else "")
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


def bad_request(request, exception=None):
    """handler400 (kiln_project/urls.py). A body over the request limit is Kiln's own page with the stable
    code request_too_large (413) and what to do about it, not Django's bare "Bad Request (400)"; any
    other 400 is Django's page. The /v1/ routes answer their own envelope before this is reached."""
    if not isinstance(exception, RequestDataTooBig):
        return defaults.bad_request(request, exception)
    limit = settings.DATA_UPLOAD_MAX_MEMORY_SIZE
    length = request.META.get("CONTENT_LENGTH") or ""
    message = (f"the request body has {length} bytes; the limit is {limit} bytes (KILN_MAX_REQUEST_BYTES)"
               if length.isdigit() else
               f"the request body is larger than the limit of {limit} bytes (KILN_MAX_REQUEST_BYTES)")
    error = KilnError(
        "request_too_large", message,
        hint="nothing was saved: send less at once (a large corpus or suite goes as a file or by its path on the "
             "server), or raise KILN_MAX_REQUEST_BYTES in the server's environment",
        status=413)
    back = request.path if request.path.startswith("/ui/") else ""
    return render(request, "ui/request_error.html", {"error": error, "back": back}, status=413)


def not_found(request, exception=None):
    """handler404: a /ui/ address with no page (an unknown adapter, job or promotion) gets the dashboard's
    page, with its navigation, instead of Django's bare "Not Found"; other paths keep Django's (the /v1/
    routes answer their own envelope)."""
    if not request.path.startswith("/ui/"):
        return defaults.page_not_found(request, exception)
    error = KilnError("not_found", f"there is no page at {request.path}", status=404,
                      hint="it may have been deleted; the navigation above lists what there is")
    return render(request, "ui/request_error.html", {"error": error, "back": "", "title": "Not found"}, status=404)


def csrf_failure(request, reason=""):
    """CSRF_FAILURE_VIEW: a dashboard form sent without a valid token (a page left open past its
    session, or a post from another site) is refused on the dashboard's page, saying what to do."""
    if not request.path.startswith("/ui/"):
        from django.views.csrf import csrf_failure as django_csrf_failure

        return django_csrf_failure(request, reason)
    error = KilnError("csrf_failed", f"the form was refused: its security token did not check ({reason})",
                      status=403, hint="reload the page and send the form again; a form from another site is never "
                                       "accepted")
    back = request.path
    return render(request, "ui/request_error.html", {"error": error, "back": back, "title": "Form refused"},
                  status=403)
