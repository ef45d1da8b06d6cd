"""Tell live pages that a job changed. Messages carry only ids: consumers re-read the database.

Redis may lose a broadcast; pages start from a database snapshot, so a lost message only delays
one update. Failing to broadcast never fails the state change that caused it.
"""

from __future__ import annotations

import logging

from asgiref.sync import async_to_sync

log = logging.getLogger(__name__)

JOBS_GROUP = "jobs"


def job_group(job_id: str) -> str:
    return f"job.{job_id}"


def broadcast_job_changed(*, job_id: str, event: str) -> None:
    from channels.layers import get_channel_layer

    layer = get_channel_layer()
    if layer is None:
        return
    message = {"type": "job.changed", "job_id": job_id, "event": event}
    try:
        async_to_sync(layer.group_send)(JOBS_GROUP, message)
        async_to_sync(layer.group_send)(job_group(job_id), message)
    except Exception as exc:  # noqa: BLE001 - the row is committed; the page catches up on reload
        log.warning("could not broadcast change of job %s: %s", job_id, exc)
