"""Read-only queries about jobs and workers for the API, the pages and /health."""

from __future__ import annotations

import uuid
from datetime import timedelta

from django.db.models import Count, Q, QuerySet
from django.utils import timezone

from core.jobs.kinds import TRACKED_TERMINAL_TTL_S, registered_kinds
from core.jobs.models import TERMINAL_STATES, Job, JobState, WorkerHeartbeat


def job_list(*, kind: str | None = None, state: str | None = None, category: str | None = None,
             limit: int = 100) -> QuerySet[Job]:
    jobs = Job.objects.filter(deleted_at__isnull=True).order_by("-id")
    if kind:
        jobs = jobs.filter(kind=kind)
    if state:
        jobs = jobs.filter(state=state)
    if category:
        jobs = jobs.filter(kind__in=[k.name for k in registered_kinds() if k.category == category])
    return jobs[:limit]


def job_get(*, job_id: str) -> Job | None:
    try:
        key = uuid.UUID(str(job_id))
    except ValueError:
        return None
    return Job.objects.filter(uuid=key, deleted_at__isnull=True).first()


def tracked_job_count(*, kind: str) -> int:
    """Jobs of `kind` still tracked: queued or running, or ended within TRACKED_TERMINAL_TTL_S; deleted
    ones are not (deleting finished jobs is how a user frees the cap at once)."""
    recent = timezone.now() - timedelta(seconds=TRACKED_TERMINAL_TTL_S)
    jobs = Job.objects.filter(kind=kind, deleted_at__isnull=True)
    return jobs.filter(~Q(state__in=TERMINAL_STATES) | Q(finished_at__gte=recent)).count()


def job_queue_position(*, job: Job) -> int | None:
    """1 for the next job to start on its queue; None once it has left the queue."""
    if job.state != JobState.QUEUED:
        return None
    return Job.objects.filter(queue=job.queue, state=JobState.QUEUED, id__lt=job.id).count() + 1


def job_events(*, job: Job, limit: int = 50, before: int | None = None):
    """Up to `limit` events, oldest first, ending just before event id `before` (the newest if None)."""
    events = job.events.order_by("-id")
    if before is not None:
        events = events.filter(id__lt=before)
    return list(events[:limit])[::-1]


def job_events_page(*, job: Job, limit: int, before: int | None = None) -> tuple[list, int | None]:
    """One page of events (oldest first) and the `before` that gives the next, older page (or None)."""
    events = job_events(job=job, limit=limit, before=before)
    older = bool(events) and job.events.filter(id__lt=events[0].id).exists()
    return events, (events[0].id if older else None)


def job_event_count(*, job: Job) -> int:
    return job.events.count()


def workers_alive() -> list[WorkerHeartbeat]:
    """Workers with a recent heartbeat whose process still exists (checked for this host's workers)."""
    from core.jobs.liveness import STALE_AFTER_SECONDS, worker_is_dead

    now = timezone.now()
    cutoff = now - timezone.timedelta(seconds=STALE_AFTER_SECONDS)
    rows = WorkerHeartbeat.objects.filter(stopped=False, last_seen__gte=cutoff).order_by("worker_id")
    return [row for row in rows if not worker_is_dead(row, now)]


def silent_worker_note(queue: str) -> str | None:
    """Why no live worker serves `queue` when one of this host's still runs: its heartbeat stopped (a
    hung process, or a full disk that refuses the database's writes). None when no such worker."""
    from core.jobs.liveness import silent_but_running

    now = timezone.now()
    for row in WorkerHeartbeat.objects.filter(stopped=False).order_by("-last_seen")[:8]:
        if queue in (row.queues or []) and silent_but_running(row, now):
            quiet = int((now - row.last_seen).total_seconds())
            return (f"its worker (pid {row.pid}) still runs but has not reported for {quiet} s: it is hung, or cannot "
                    "write to the database (is the disk full? df -h on KILN_HOME's disk)")
    return None


def job_counts() -> dict[str, int]:
    counts = {state: 0 for state in JobState.values}
    for row in Job.objects.filter(deleted_at__isnull=True).values("state").annotate(n=Count("id")):
        counts[row["state"]] = row["n"]
    return counts
