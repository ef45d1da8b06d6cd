"""Services that change job state. Each writes its event row and schedules its broadcast on commit.

Every transition is a conditional UPDATE on the current state, so two processes can never both
start, finish or cancel the same job: nothing runs twice.
"""

from __future__ import annotations

from django.db import transaction
from django.utils import timezone

from core.accounts.permissions import check_owner_or_permitted
from core.db_locks import serialize
from core.errors import KilnError
from core.jobs.broadcast import broadcast_job_changed
from core.jobs.kinds import MAX_TRACKED_JOBS, TRACKED_TERMINAL_TTL_S, get_job_kind
from core.jobs.models import TERMINAL_STATES, Job, JobEvent, JobState
from core.jobs.selectors import tracked_job_count


def _event(job: Job, type_: str, message: str = "", data: dict | None = None) -> None:
    JobEvent.objects.create(job=job, type=type_, message=message[:500], data=data or {})
    transaction.on_commit(lambda: broadcast_job_changed(job_id=str(job.uuid), event=type_))


def job_submit(*, kind: str, payload, title: str = "", user=None, max_queued: int | None = None,
               follow_up: bool = False) -> Job:
    """Persist a queued job and wake its queue after commit. Refuses with 503 when the queue is full,
    or when the kind has a tracked cap (`JobKind.tracked_full_code`) and MAX_TRACKED_JOBS of it are
    tracked. `payload` is the kind's typed payload (or a dict of it); it is stored as plain data.
    `follow_up`: queued by a job as it publishes (a training's activation or gate), which the queue
    cap never refuses: the refusal would fail work already admitted and done."""
    from django.conf import settings

    from core.jobs.dispatch import wake_queue

    job_kind = get_job_kind(kind)
    if job_kind is None:
        raise KilnError("job_kind_unknown", f"no job kind named {kind!r} is registered", status=400)
    payload = job_kind.stored_payload(payload)
    cap = max_queued if max_queued is not None else settings.KILN.max_queued_jobs
    with transaction.atomic():
        serialize(f"jobs.queue.{job_kind.queue}")  # the count and the insert as one step: the cap holds under races
        queued = Job.objects.filter(queue=job_kind.queue, state=JobState.QUEUED).count()
        if queued >= cap and not follow_up:
            raise KilnError(
                job_kind.queue_full_code,
                f"the {job_kind.queue} queue already holds {queued} queued jobs (cap {cap})",
                hint="wait for queued work to finish, or cancel some, then submit again",
                status=503,
                headers={"Retry-After": str(job_kind.queue_full_retry_after)},
            )
        if job_kind.tracked_full_code and (tracked := tracked_job_count(kind=kind)) >= MAX_TRACKED_JOBS:
            raise KilnError(
                job_kind.tracked_full_code,
                f"{tracked} {kind} jobs are tracked (cap {MAX_TRACKED_JOBS}: queued, running, or ended within "
                f"the last {TRACKED_TERMINAL_TTL_S // 60} minutes)",
                hint="delete finished jobs you no longer need, or wait for them to age out, then submit again",
                status=503,
                headers={"Retry-After": str(job_kind.queue_full_retry_after)},
            )
        job = Job.objects.create(
            kind=kind,
            queue=job_kind.queue,
            title=title[:200],
            payload=payload,
            submitted_by=user if getattr(user, "is_authenticated", False) else None,
        )
        _event(job, "queued", f"queued on {job.queue}")
        queue_name = job.queue
        transaction.on_commit(lambda: wake_queue(queue_name))
    return job


def job_claim_next(*, queue: str, worker_id: str) -> Job | None:
    """Move the oldest queued job of a queue to running for this worker; None when none is left."""
    while True:
        candidate = Job.objects.filter(queue=queue, state=JobState.QUEUED).order_by("id").first()
        if candidate is None:
            return None
        now = timezone.now()
        with transaction.atomic():
            claimed = Job.objects.filter(id=candidate.id, state=JobState.QUEUED).update(
                state=JobState.RUNNING, worker_id=worker_id, started_at=now, updated_at=now
            )
            if claimed:
                job = Job.objects.get(id=candidate.id)
                _event(job, "running", f"started by {worker_id}")
                return job
        # Another worker took it (or it was cancelled) between the read and the update: try the next.


def metrics_delta(before: dict | None, after: dict) -> dict:
    """The scalar metrics that changed: what a progress event keeps (the row holds the rest once)."""
    before = before or {}
    return {key: value for key, value in after.items()
            if isinstance(value, int | float | str | bool | type(None)) and (key not in before or before[key] != value)}


def job_report_progress(*, job: Job, progress: float, message: str = "", metrics: dict | None = None) -> None:
    """Record progress on the row (metrics replace the row's, histories included) and append an
    event with only what changed, so a long run's events grow with its steps, not quadratically."""
    progress = min(max(float(progress), 0.0), 1.0)
    fields = {"progress": progress, "progress_message": message[:300], "updated_at": timezone.now()}
    if metrics is not None:
        fields["metrics"] = metrics
    with transaction.atomic():
        updated = Job.objects.filter(id=job.id, state=JobState.RUNNING).update(**fields)
        if updated:
            delta = metrics_delta(job.metrics, metrics) if metrics is not None else {}
            job.progress, job.progress_message = progress, message[:300]
            if metrics is not None:
                job.metrics = dict(metrics)
            _event(job, "progress", message, {"progress": progress, **({"metrics": delta} if delta else {})})


def job_log(*, job: Job, message: str, data: dict | None = None) -> None:
    with transaction.atomic():
        _event(job, "log", message, data)


def _after_unsuccessful(job: Job) -> None:
    kind = get_job_kind(job.kind)
    if kind is not None:
        transaction.on_commit(lambda: kind.run_unsuccessful_hook(job))


def _finish(job: Job, state: str, *, event_message: str, **fields) -> bool:
    now = timezone.now()
    with transaction.atomic():
        updated = Job.objects.filter(id=job.id, state=JobState.RUNNING).update(
            state=state, finished_at=now, updated_at=now, **fields
        )
        if updated:
            # The hooks read the job's outcome from this object: give it the row's new values.
            job.state, job.finished_at, job.updated_at = state, now, now
            for name, value in fields.items():
                setattr(job, name, value)
            _event(job, state, event_message, {k: v for k, v in fields.items() if k.startswith("error")})
            if state != JobState.COMPLETED:
                _after_unsuccessful(job)
    return bool(updated)


def job_complete(*, job: Job, result: dict) -> bool:
    # The last progress line ("publishing results.json") would read as still going on a finished job.
    return _finish(job, JobState.COMPLETED, event_message="completed", result=result or {}, progress=1.0,
                   progress_message="completed")


def job_fail(*, job: Job, code: str, message: str, result: dict | None = None) -> bool:
    return _finish(
        job, JobState.FAILED, event_message=f"{code}: {message}", error_code=code, error_message=message,
        result=result or {},
    )


def job_mark_cancelled(*, job: Job, result: dict | None = None) -> bool:
    return _finish(
        job, JobState.CANCELLED, event_message="cancelled while running", error_code="job_cancelled",
        error_message="cancelled on request", result=result or {},
    )


def job_delete(*, job: Job, user=None, not_finished_code: str = "job_not_deletable",
               not_found_code: str = "job_not_found", cancel_how: str = "") -> Job:
    """Hide a finished job from the API and pages. The row and its events stay (audit), with a
    `deleted` event naming who deleted it; a queued or running job must be cancelled first.
    `not_found_code`: the route's own 404 code, also when a concurrent delete won the race; `cancel_how`: the
    route family's own way to cancel, for the hint of a refusal."""
    who = getattr(user, "username", "") or "anonymous"
    check_owner_or_permitted(owner_id=job.submitted_by_id, user=user, what=f"job {job.uuid}",
                             code="job_delete_forbidden")
    with transaction.atomic():
        updated = Job.objects.filter(id=job.id, state__in=TERMINAL_STATES, deleted_at__isnull=True).update(
            deleted_at=timezone.now())
        if not updated:
            job.refresh_from_db()
            if job.deleted_at is not None:
                raise KilnError(not_found_code, f"job {job.uuid} was already deleted", status=404)
            raise KilnError(not_finished_code, f"job {job.uuid} is {job.state}; cancel it first", status=409,
                            hint=f"cancel it ({cancel_how or f'kiln jobs cancel {job.uuid}'}), wait until it has "
                                 "stopped, then delete it")
        _event(job, "deleted", f"deleted by {who}")
    job.refresh_from_db()
    return job


def job_cancel(*, job: Job, user=None, system: bool = False) -> Job:
    """Cancel a queued job at once, or ask a running one to stop at its next safe boundary. `user` must
    own it or hold jobs.delete_others_jobs (403 job_cancel_forbidden); `system`: Kiln itself cancels
    (a gate's evaluation whose training went), no user to check."""
    if not system:
        check_owner_or_permitted(owner_id=job.submitted_by_id, user=user, what=f"job {job.uuid}",
                                 code="job_cancel_forbidden")
    who = getattr(user, "username", "") or ("kiln" if system else "anonymous")
    now = timezone.now()
    with transaction.atomic():
        if Job.objects.filter(id=job.id, state=JobState.QUEUED).update(
            state=JobState.CANCELLED, error_code="job_cancelled", error_message=f"cancelled by {who} before it started",
            finished_at=now, updated_at=now,
        ):
            job.refresh_from_db()
            _event(job, "cancelled", f"cancelled by {who} while queued")
            _after_unsuccessful(job)
            return job
        if Job.objects.filter(id=job.id, state=JobState.RUNNING, cancel_requested=False, publishing=False).update(
            cancel_requested=True, updated_at=now
        ):
            job.refresh_from_db()
            _event(job, "cancel_requested", f"cancellation requested by {who}")
            return job
    job.refresh_from_db()
    if job.state in TERMINAL_STATES:
        raise KilnError(
            "job_not_cancellable", f"job {job.uuid} is already {job.state}", status=409,
            hint="only queued or running jobs can be cancelled",
        )
    if job.publishing and not job.cancel_requested:
        raise KilnError(
            "job_not_cancellable", f"job {job.uuid} finished its work and is publishing its result; "
            "a cancel can no longer stop it", status=409,
            hint="wait for it to complete, then reject, unload or delete what it published",
        )
    return job  # running with cancellation already requested: cancelling twice is harmless


def jobs_fail_interrupted(*, job_ids: list[int], reason: str) -> int:
    """Fail jobs whose worker died mid-run (restart recovery). They are never re-run silently."""
    count = 0
    for job in Job.objects.filter(id__in=job_ids, state=JobState.RUNNING):
        if job_fail(job=job, code="job_interrupted", message=reason):
            count += 1
    return count
