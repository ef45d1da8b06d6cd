"""Tell live pages that a job changed. Messages carry only ids: consumers re-read the database.

Redis may lose a broadcast; pages start from a database snapshot, so a lost message only delays
one update. Failing to broadcast never fails the state change that caused it, nor holds it up: a
broadcast gets BROADCAST_TIMEOUT_SECONDS, and after one fails no progress or log event is tried for
BROADCAST_PAUSE_SECONDS (a job's start and end always are: a page waits for those). Without that,
a stalled Redis (SIGSTOP) held every training step for the channel layer's 20-second socket
timeout (QA: a 153-step run would have taken 50 minutes).
"""

from __future__ import annotations

import asyncio
import logging
import time

from asgiref.sync import async_to_sync

log = logging.getLogger(__name__)

BROADCAST_TIMEOUT_SECONDS = 1.0
BROADCAST_PAUSE_SECONDS = 10.0
_paused_until = 0.0  # time.monotonic() before which no pausable broadcast is tried (this process)
PAUSABLE_EVENTS = frozenset({"progress", "log"})  # many per job; the rest (running, completed, ...) are few

JOBS_GROUP = "jobs"


def job_group(job_id: str) -> str:
    return f"job.{job_id}"


def broadcast_job_changed(*, job_id: str, event: str) -> None:
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None:
        return
    global _paused_until
    if event in PAUSABLE_EVENTS and time.monotonic() < _paused_until:
        return
    message = {"type": "job.changed", "job_id": job_id, "event": event}

    async def send() -> None:
        await asyncio.wait_for(asyncio.gather(layer.group_send(JOBS_GROUP, message),
                                              layer.group_send(job_group(job_id), message)),
                               BROADCAST_TIMEOUT_SECONDS)

    try:
        async_to_sync(send)()
    except Exception as exc:  # noqa: BLE001 - the row is committed; the page catches up on reload
        _paused_until = time.monotonic() + BROADCAST_PAUSE_SECONDS
        log.warning("could not broadcast change of job %s (%s: %s); live updates pause for %.0f s", job_id,
                    type(exc).__name__, exc, BROADCAST_PAUSE_SECONDS)
