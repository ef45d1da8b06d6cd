"""Dramatiq actors: one wake-up actor per queue. A message means "look for queued work here".

GPU work is never retried silently (max_retries=0): a failure is recorded on the job row.
"""

from __future__ import annotations

import dramatiq

from core.jobs.runner import run_queued_jobs

# Generous outer limits: a training run may take hours; jobs stop cooperatively well before this.
GPU_TIME_LIMIT_MS = 24 * 3600 * 1000
CONTROL_TIME_LIMIT_MS = 12 * 3600 * 1000


@dramatiq.actor(queue_name="gpu", max_retries=0, time_limit=GPU_TIME_LIMIT_MS)
def wake_gpu_queue() -> None:
    run_queued_jobs("gpu")


@dramatiq.actor(queue_name="control", max_retries=0, time_limit=CONTROL_TIME_LIMIT_MS)
def wake_control_queue() -> None:
    run_queued_jobs("control")


WAKE_ACTORS = {"gpu": wake_gpu_queue, "control": wake_control_queue}
