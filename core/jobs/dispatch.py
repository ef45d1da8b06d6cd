"""Send wake-ups to the worker queues. Losing one is harmless: workers re-scan queued rows at boot,
and `kiln serve` re-sends one for a queue whose jobs have waited with nothing running (a wake-up
lost while Redis stalled or restarted would otherwise leave them queued until the next submission).

A wake-up is sent by a sender thread of the queue, and the caller waits for it at most
WAKE_WAIT_SECONDS: the broker's client waits on a stalled Redis (SIGSTOP, a full network buffer)
until it answers, and a submission must not (QA: POST /v1/train/grpo took 25 s, as long as Redis
was stopped), yet a short-lived process that submits and exits must see its wake-up sent. Every
wake-up is sent, in order: the control queue runs one job per message in parallel (runs admitted
together, an eval beside the gate that waits for it), so merging them would serialize those."""

from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)

WAKE_WAIT_SECONDS = 2.0
_requested: dict[str, int] = {}  # wake-ups asked for, per queue (a ticket number each)
_sent: dict[str, int] = {}  # wake-ups the queue's sender has sent (or failed to), per queue
_senders: set[str] = set()  # queues whose sender thread runs
_progress = threading.Condition()


def wake_queue(queue: str) -> None:
    with _progress:
        ticket = _requested[queue] = _requested.get(queue, 0) + 1
        if queue not in _senders:
            _senders.add(queue)
            threading.Thread(target=_send_wakes, args=(queue,), name=f"kiln-wake-{queue}", daemon=True).start()
        _progress.wait_for(lambda: _sent.get(queue, 0) >= ticket, timeout=WAKE_WAIT_SECONDS)


def _send_wakes(queue: str) -> None:
    from core.jobs.tasks import WAKE_ACTORS

    while True:
        with _progress:
            if _sent.get(queue, 0) >= _requested.get(queue, 0):
                _senders.discard(queue)
                return
        try:
            WAKE_ACTORS[queue].send()
        except Exception as exc:  # noqa: BLE001 - the job row is queued; the next worker boot picks it up
            log.warning("could not wake the %s queue: %s", queue, exc)
        with _progress:
            _sent[queue] = _sent.get(queue, 0) + 1
            _progress.notify_all()


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
