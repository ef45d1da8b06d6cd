"""Send wake-ups to the worker queues. Losing one is harmless: workers re-scan queued rows at boot."""

from __future__ import annotations

import logging

log = logging.getLogger(__name__)


def wake_queue(queue: str) -> None:
    from core.jobs.tasks import WAKE_ACTORS

    try:
        WAKE_ACTORS[queue].send()
    except Exception as exc:  # noqa: BLE001 - the job row is queued; the next worker boot picks it up
        log.warning("could not wake the %s queue: %s", queue, exc)
