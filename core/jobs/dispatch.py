"""Send wake-ups to the worker queues. Losing one is harmless: workers re-scan queued rows at boot,
and `kiln serve` re-sends one for a queue whose jobs have waited with nothing running (a wake-up
lost while Redis stalled or restarted would otherwise leave them queued until the next submission).

A wake-up is sent from a thread of its own: the broker's client waits on a stalled Redis (SIGSTOP,
a full network buffer) until it answers, and a submission must not (QA: POST /v1/train/grpo took
25 s, as long as Redis was stopped). One wake-up per queue is in flight at a time: a worker drains
every queued row once woken, so another would add nothing but a thread stuck on the same Redis."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)

_in_flight: set[str] = set()
_in_flight_lock = threading.Lock()


def wake_queue(queue: str) -> None:
    with _in_flight_lock:
        if queue in _in_flight:
            return
        _in_flight.add(queue)
    threading.Thread(target=_send_wake, args=(queue,), name=f"kiln-wake-{queue}", daemon=True).start()


def _send_wake(queue: str) -> None:
    from core.jobs.tasks import WAKE_ACTORS

    try:
        WAKE_ACTORS[queue].send()
    except Exception as exc:  # noqa: BLE001 - the job row is queued; the next worker boot picks it up
        log.warning("could not wake the %s queue: %s", queue, exc)
    finally:
        with _in_flight_lock:
            _in_flight.discard(queue)


def wake_stalled_queues(*, waited_seconds: float = 20.0) -> list[str]:
    """Wake each queue that has a job queued for longer than `waited_seconds` and none running; return
    the queues woken. Cheap (one query), so the supervisor may call it every few seconds."""
    from datetime import timedelta

    from django.utils import timezone

    from core.jobs.models import Job, JobState
    from core.jobs.tasks import WAKE_ACTORS

    before = timezone.now() - timedelta(seconds=waited_seconds)
    running = set(Job.objects.filter(state=JobState.RUNNING).values_list("queue", flat=True))
    waiting = set(Job.objects.filter(state=JobState.QUEUED, created_at__lt=before).values_list("queue", flat=True))
    woken = sorted(q for q in waiting - running if q in WAKE_ACTORS)
    for queue in woken:
        wake_queue(queue)
    return woken
