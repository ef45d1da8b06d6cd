"""Runs claimed jobs inside a worker: the context handed to handlers, cancellation and shutdown.

A handler is `def handler(ctx: JobContext) -> dict`. It reports through ctx.report_progress, polls
ctx.should_stop() at safe boundaries and raises JobCancelled (or returns) when asked to stop, and
raises KilnError(code, message) to fail with a stable code.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from core.errors import DISK_FULL_CODE, KilnError, is_disk_full
from core.jobs.kinds import EXCLUSIVE_QUEUES, get_job_kind

log = logging.getLogger(__name__)

_queue_locks = {queue: threading.Lock() for queue in EXCLUSIVE_QUEUES}
_shutting_down = threading.Event()
_CANCEL_POLL_SECONDS = 0.5


class JobCancelled(Exception):
    """Raised by a handler that stopped early because should_stop() said so."""


class JobContext:
    def __init__(self, job):
        self.job = job
        self.job_id = str(job.uuid)
        self.payload = job.payload
        self._last_cancel_check = 0.0
        self._cancel_seen = False
        self.publishing = False

    def report_progress(self, progress: float, message: str = "", metrics: dict | None = None) -> None:
        from core.jobs.services import job_report_progress

        job_report_progress(job=self.job, progress=progress, message=message, metrics=metrics)

    def log(self, message: str, data: dict | None = None) -> None:
        from core.jobs.services import job_log

        job_log(job=self.job, message=message, data=data)

    def should_stop(self) -> bool:
        """True once cancellation was requested or the worker is shutting down (cheap to call often)."""
        if self._cancel_seen or _shutting_down.is_set():
            return True
        now = time.monotonic()
        if now - self._last_cancel_check >= _CANCEL_POLL_SECONDS:
            from core.jobs.models import Job

            self._last_cancel_check = now
            self._cancel_seen = Job.objects.filter(id=self.job.id, cancel_requested=True).exists()
        return self._cancel_seen

    def raise_if_stopped(self) -> None:
        if self.should_stop():
            raise JobCancelled()

    def begin_publishing(self) -> None:
        """The handler's point of no return: called just before it publishes its result (inside the
        transaction that publishes it, where there is one).

        should_stop() is polled and may be half a second stale, so a cancel that came while the last
        of the work ran would otherwise be accepted (200) and then ignored. Here the job row is
        marked in the same transaction: a cancel requested before stops the job (JobCancelled, and
        the transaction publishes nothing); one that comes after is refused (409
        job_not_cancellable). A worker shutting down lets finished work publish."""
        from core.jobs.models import Job, JobState

        # Still running, too: a worker that stalled while restart recovery failed its job publishes nothing.
        if not Job.objects.filter(id=self.job.id, state=JobState.RUNNING, cancel_requested=False).update(
                publishing=True):
            self._cancel_seen = True
            raise JobCancelled()
        self.publishing = True


_queue_gates: dict[str, Callable[[], bool]] = {}


def set_queue_gate(queue: str, ready: Callable[[], bool]) -> None:
    """Claim jobs of `queue` in this process only while `ready()` says so (the GPU worker: while it
    holds the device lock, so an orphaned worker that still holds it keeps the new one waiting)."""
    _queue_gates[queue] = ready


def shutting_down() -> bool:
    return _shutting_down.is_set()


def request_shutdown() -> None:
    """Ask running handlers to stop; their jobs end failed with job_interrupted (not silently re-run)."""
    _shutting_down.set()


def run_queued_jobs(queue: str) -> None:
    """Drain a queue in FIFO order; exclusive queues run one job at a time in this process."""
    from core.jobs.models import Job, JobState
    from core.jobs.worker_state import current_worker_id

    lock = _queue_locks.get(queue)
    gate = _queue_gates.get(queue)
    if gate is not None and not gate():
        return  # woken again once the gate opens
    while not _shutting_down.is_set():
        if lock is not None and not lock.acquire(blocking=False):
            return  # the thread holding the lock drains the queue, and re-checks after releasing it
        try:
            while not _shutting_down.is_set():
                if not _run_one(queue, current_worker_id()):
                    break
        finally:
            if lock is not None:
                lock.release()
        if lock is None or not Job.objects.filter(queue=queue, state=JobState.QUEUED).exists():
            return


def _run_one(queue: str, worker_id: str) -> bool:
    from core.jobs import services

    job = services.job_claim_next(queue=queue, worker_id=worker_id)
    if job is None:
        return False
    kind = get_job_kind(job.kind)
    if kind is None:
        _record_end(job, services.job_fail, code="job_kind_unknown",
                    message=f"this worker has no handler for {job.kind!r}")
        return True
    ctx = JobContext(job)
    try:
        result = kind.load_handler()(ctx)
    except JobCancelled:
        _settle_stopped(job, ctx, result=None)
    except KilnError as exc:
        # A handler may attach what it did find out (`job_result`) to the refusal that fails its job.
        _record_end(job, services.job_fail, code=exc.code, message=exc.message,
                    result=getattr(exc, "job_result", None))
    except BaseException as exc:  # noqa: BLE001 - includes dramatiq's TimeLimitExceeded
        log.exception("job %s failed", job.uuid)
        _record_end(job, services.job_fail, code=_unexpected_code(exc), message=f"{type(exc).__name__}: {exc}"[:2000])
        if not isinstance(exc, Exception):
            raise
    else:
        if not ctx.publishing and (ctx._cancel_seen or _shutting_down.is_set()):
            _settle_stopped(job, ctx, result=result)
        else:
            _record_end(job, services.job_complete, result=result or {})
    return True


def _unexpected_code(exc: BaseException) -> str:
    if type(exc).__name__ == "TimeLimitExceeded":
        return "job_time_limit"
    # e.g. the database refused the handler's progress write: the disk is full (README: the job's code)
    return DISK_FULL_CODE if is_disk_full(exc) else "job_error"


def _settle_stopped(job, ctx: JobContext, result: dict | None) -> None:
    from core.jobs import services

    if _shutting_down.is_set() and not ctx._cancel_seen:
        _record_end(job, services.job_fail, code="job_interrupted", message="the worker shut down while the job ran",
                    result=result)
    else:
        _record_end(job, services.job_mark_cancelled, result=result)


# Recording a job's end: while the database refuses writes (its disk full, a restart), try again
# with backoff rather than let the worker thread die and leave the row `running` for good.
RECORD_RETRY_FIRST_SECONDS = 1.0
RECORD_RETRY_MAX_SECONDS = 10.0
RECORD_RETRY_TOTAL_SECONDS = 6 * 3600.0
_sleep = time.sleep  # tests replace it


def _record_end(job, write: Callable[..., bool], **fields) -> bool:
    """`write(job=job, **fields)` (a terminal transition), retried while the database refuses it, until
    it succeeds, the worker shuts down (restart recovery then fails the job job_interrupted) or
    RECORD_RETRY_TOTAL_SECONDS pass. Returns what `write` returned; False when it gave up."""
    from django.db import DatabaseError

    delay, waited, failures = RECORD_RETRY_FIRST_SECONDS, 0.0, 0
    while True:
        try:
            written = write(job=job, **fields)
        except DatabaseError as exc:
            failures += 1
            if _shutting_down.is_set() or waited + delay > RECORD_RETRY_TOTAL_SECONDS:
                log.error("could not record the end of job %s after %d tries (%s); it stays running until a "
                          "worker restart fails it job_interrupted", job.uuid, failures, exc)
                return False
            if failures == 1:
                hint = " (free disk space where the database lives)" if is_disk_full(exc) else ""
                log.warning("the database refused the end of job %s: %s%s; trying again every few seconds",
                            job.uuid, exc, hint)
            _release_broken_connection()
            _sleep(delay)
            waited += delay
            delay = min(delay * 2, RECORD_RETRY_MAX_SECONDS)
            continue
        if failures:
            log.warning("recorded the end of job %s after %d refused tries", job.uuid, failures)
        return written


def _release_broken_connection() -> None:
    """Drop a connection the failure left unusable (a restarted PostgreSQL); the next try reconnects."""
    from django.db import connection

    if not connection.in_atomic_block:
        connection.close_if_unusable_or_obsolete()
