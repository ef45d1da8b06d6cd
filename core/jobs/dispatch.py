"""Send wake-ups to the worker queues. Losing one is harmless: workers re-scan queued rows at boot,
and `kiln serve` re-sends one for a queue whose jobs have waited with nothing running (a wake-up
lost while Redis stalled or restarted would otherwise leave them queued until the next submission).

A wake-up is sent from a thread of its own: the broker's client waits on a stalled Redis (SIGSTOP,
a full network buffer) until it answers, and a submission must not (QA: POST /v1/train/grpo took
25 s, as long as Redis was stopped). Every wake-up is still sent, one by one, by one sender thread
per queue: the control queue runs one job per message in parallel (runs admitted together, an
eval beside the gate that waits for it), so a wake-up merged into another would serialize them."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)

_unsent: dict[str, int] = {}  # wake-ups asked for and not yet sent, per queue (its sender thread runs)
_unsent_lock = threading.Lock()


def wake_queue(queue: str) -> None:
    with _unsent_lock:
        waiting = _unsent.get(queue, 0)
        _unsent[queue] = waiting + 1
        if waiting:
            return  # this queue's sender thread sends it after the ones before it
    threading.Thread(target=_send_wakes, args=(queue,), name=f"kiln-wake-{queue}", daemon=True).start()


def _send_wakes(queue: str) -> None:
    from core.jobs.tasks import WAKE_ACTORS

    while True:
        try:
            WAKE_ACTORS[queue].send()
        except Exception as exc:  # noqa: BLE001 - the job row is queued; the next worker boot picks it up
            log.warning("could not wake the %s queue: %s", queue, exc)
        with _unsent_lock:
            _unsent[queue] -= 1
            if _unsent[queue] == 0:
                del _unsent[queue]
                return


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
