"""/v1/jobs: list, inspect and cancel jobs of every kind. Kind-specific routes live with each app."""

from __future__ import annotations

from ninja import Router

from core.accounts.auth import require_permission
from core.errors import KilnError
from core.jobs import selectors, services
from core.jobs.kinds import get_job_kind, registered_kinds
from core.jobs.models import JobState
from core.jobs.schemas import JobDetailOut, JobEventsPage, JobOut, job_out

router = Router(tags=["jobs"])


def _get_or_404(job_id: str):
    job = selectors.job_get(job_id=job_id)
    if job is None:
        raise KilnError("job_not_found", f"no job with id {job_id!r}", status=404,
                        hint="list jobs with GET /v1/jobs")
    return job


@router.get("", response=list[JobOut], summary="List jobs, newest first (scalar metrics; one job has its histories)")
def list_jobs(request, kind: str | None = None, state: str | None = None, limit: int = 100):
    if state and state not in JobState.values:
        raise KilnError("invalid_state", f"state must be one of {', '.join(JobState.values)}", status=400)
    if kind and get_job_kind(kind) is None:  # a typo would otherwise list nothing, as if no such job ran
        raise KilnError("invalid_kind", f"kind must be one of {', '.join(k.name for k in registered_kinds())}",
                        status=400, field="kind",
                        hint="leave kind out for every kind; GET /v1/config lists them (job_kinds)")
    if not 1 <= limit <= 1000:
        raise KilnError("invalid_limit", "limit must be between 1 and 1000", status=400)
    jobs = selectors.job_list(kind=kind, state=state, limit=limit).select_related("submitted_by")
    return [job_out(job, position=selectors.job_queue_position(job=job), listed=True) for job in jobs]


DETAIL_EVENTS = 50
MAX_EVENTS_PAGE = 500


@router.get("/{job_id}", response=JobDetailOut, summary="One job with its payload and its newest events")
def get_job(request, job_id: str):
    job = _get_or_404(job_id)
    data = job_out(job, position=selectors.job_queue_position(job=job))
    data["payload"] = job.payload
    data["events"] = selectors.job_events(job=job, limit=DETAIL_EVENTS)
    data["events_total"] = selectors.job_event_count(job=job)
    return data


@router.get("/{job_id}/events", response=JobEventsPage, summary="A job's events, a page at a time, newest page first")
def get_job_events(request, job_id: str, before: int | None = None, limit: int = 200):
    job = _get_or_404(job_id)
    if not 1 <= limit <= MAX_EVENTS_PAGE:
        raise KilnError("invalid_limit", f"limit must be between 1 and {MAX_EVENTS_PAGE}", status=400)
    events, next_before = selectors.job_events_page(job=job, limit=limit, before=before)
    return {"events": events, "next_before": next_before}


@router.delete("/{job_id}", response=JobOut, summary="Cancel a queued or running job")
def cancel_job(request, job_id: str):
    require_permission(request, "submit_job")
    job = services.job_cancel(job=_get_or_404(job_id), user=request.user)
    return job_out(job, position=selectors.job_queue_position(job=job))
