"""This worker process's identity, its heartbeat row, and restart recovery of the queues it serves."""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
import uuid

from django.db import close_old_connections
from django.utils import timezone

from core.jobs.liveness import worker_is_dead

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 5
# Every so many beats, fail the running jobs of workers that died since boot (an orphan that was
# stopped, a host that went away): their jobs end job_interrupted within about this long.
RECOVER_EVERY_BEATS = 3
# An orphan (its supervisor died) is asked to stop, then killed if it has not stopped by then.
ORPHAN_GRACE_SECONDS = 45

_worker_id: str | None = None
_worker_queues: list[str] = []
_worker_status: dict = {}
_status_sources: dict = {}  # name -> a callable read at every beat (set_worker_status_source)
_stop = threading.Event()


def current_worker_id() -> str:
    global _worker_id
    if _worker_id is None:
        _worker_id = f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
    return _worker_id


def set_worker_status(**status) -> None:
    """Extra facts a worker publishes in its heartbeat (e.g. whether the model loaded, and why not)."""
    _worker_status.update(status)


def set_worker_status_source(name: str, read) -> None:
    """A fact read afresh at every beat (e.g. the accelerator's free memory): `read()` returns its
    value; one that raises leaves the fact out of that beat."""
    _status_sources[name] = read


def _status_now() -> dict:
    status = dict(_worker_status)
    for name, read in list(_status_sources.items()):
        try:
            status[name] = read()
        except Exception as exc:  # noqa: BLE001 - a fact that cannot be read now is absent, not fatal
            log.warning("worker status %s unavailable: %s", name, exc)
            status.pop(name, None)
    return status


def beat() -> None:
    from core.jobs.models import WorkerHeartbeat

    now = timezone.now()
    status = _status_now()
    WorkerHeartbeat.objects.update_or_create(
        worker_id=current_worker_id(),
        defaults={
            "hostname": socket.gethostname(),
            "pid": os.getpid(),
            "queues": _worker_queues,
            "status": status,
            "last_seen": now,
            "stopped": False,
        },
        create_defaults={
            "hostname": socket.gethostname(), "pid": os.getpid(), "queues": _worker_queues,
            "status": status, "started_at": now, "last_seen": now,
        },
    )


def recover_queues(queues: list[str]) -> list[int]:
    """Fail running jobs whose worker died; return the ids of queued jobs to dispatch again, in order."""
    from core.jobs.models import Job, JobState, WorkerHeartbeat
    from core.jobs.services import jobs_fail_interrupted

    me = current_worker_id()
    interrupted = []
    for job in Job.objects.filter(queue__in=queues, state=JobState.RUNNING).exclude(worker_id=me):
        heartbeat = WorkerHeartbeat.objects.filter(worker_id=job.worker_id).first()
        if worker_is_dead(heartbeat):
            interrupted.append(job.id)
    if interrupted:
        count = jobs_fail_interrupted(job_ids=interrupted, reason="its worker stopped while the job was running")
        log.warning("marked %d interrupted job(s) failed", count)
    return list(Job.objects.filter(queue__in=queues, state=JobState.QUEUED).order_by("id").values_list("id", flat=True))


def start_worker(queues: list[str]) -> None:
    """Register this process, recover its queues, wake them, and keep the heartbeat going."""
    from core.jobs.dispatch import wake_queue

    global _worker_queues, _boot_parent
    _worker_queues = sorted(set(queues))
    _boot_parent = os.getppid()
    beat()
    recoverable = [q for q in _worker_queues if q in ("gpu", "control")]
    queued = recover_queues(recoverable)
    from core.jobs.models import Job

    for queue in recoverable:
        waiting = Job.objects.filter(id__in=queued, queue=queue).count()
        for _ in range(max(waiting, 0) if queue != "gpu" else min(waiting, 1)):
            wake_queue(queue)
    close_old_connections()
    threading.Thread(target=_heartbeat_loop, name="kiln-heartbeat", daemon=True).start()


_boot_parent: int | None = None  # this worker's parent when it started (start_worker)


def orphaned() -> bool:
    """Whether this worker's parent (dramatiq's supervisor under kiln serve) has gone since it started:
    an orphan stops (the heartbeat below) and meanwhile starts no new work (e.g. admits no OpenEnv run)."""
    return _boot_parent is not None and os.getppid() != _boot_parent


def _heartbeat_loop() -> None:
    beats, orphaned_at = 0, None
    while not _stop.wait(HEARTBEAT_SECONDS):
        beats += 1
        # The kernel's parent-death signal stops a worker whose supervisor died; this catches a
        # signal that came too early or a shutdown that hangs, so no orphan keeps the GPU.
        if orphaned():
            if orphaned_at is None:
                orphaned_at = time.monotonic()
                log.warning("the worker's supervisor is gone; stopping")
                os.kill(os.getpid(), signal.SIGTERM)
            elif time.monotonic() - orphaned_at > ORPHAN_GRACE_SECONDS:
                os.kill(os.getpid(), signal.SIGKILL)
        try:
            beat()
            if beats % RECOVER_EVERY_BEATS == 0:
                recover_queues([q for q in _worker_queues if q in ("gpu", "control")])
        except Exception as exc:  # noqa: BLE001 - a missed beat is retried; the DB may be restarting
            log.warning("heartbeat failed: %s", exc)
        finally:
            close_old_connections()


def stop_worker() -> None:
    from core.jobs.models import WorkerHeartbeat

    _stop.set()
    try:
        WorkerHeartbeat.objects.filter(worker_id=current_worker_id()).update(stopped=True, last_seen=timezone.now())
    except Exception as exc:  # noqa: BLE001
        log.warning("could not record worker stop: %s", exc)
