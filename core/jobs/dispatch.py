"""Send wake-ups to the worker queues. Losing one is harmless: workers re-scan queued rows at boot,
and `kiln serve` re-sends one for a queue whose jobs have waited with nothing running (a wake-up
lost while Redis stalled or restarted would otherwise leave them queued until the next submission)."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def wake_queue(queue: str) -> None:
    from core.jobs.tasks import WAKE_ACTORS

    try:
        WAKE_ACTORS[queue].send()
    except Exception as exc:  # noqa: BLE001 - the job row is queued; the next worker boot picks it up
        log.warning("could not wake the %s queue: %s", queue, exc)


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
