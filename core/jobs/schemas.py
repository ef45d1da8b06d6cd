"""API shapes of jobs (shared by every job kind)."""

from __future__ import annotations

from datetime import datetime

from ninja import Schema

from core.jobs.error_hints import job_error


class JobEventOut(Schema):
    id: int
    type: str
    message: str
    data: dict
    created_at: datetime


class JobOut(Schema):
    id: str
    kind: str
    queue: str
    state: str
    title: str
    progress: float
    progress_message: str
    metrics: dict
    result: dict
    error: dict | None
    cancel_requested: bool
    queue_position: int | None
    submitted_by: str | None
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None


class JobDetailOut(JobOut):
    payload: dict
    events: list[JobEventOut]  # the newest events (GET .../events pages through the rest)
    events_total: int


class JobEventsPage(Schema):
    events: list[JobEventOut]  # oldest first
    next_before: int | None  # pass as ?before= for the page of older events; null on the first page


def listed_metrics(metrics: dict) -> dict:
    """A list row's metrics: the scalars (step, loss, reward_mean, ...), not the per-step histories,
    which made one row of a long training about 150 KB (QA); GET /v1/jobs/{id} has them whole."""
    return {key: value for key, value in (metrics or {}).items() if not isinstance(value, list)}


def job_out(job, *, position: int | None = None, listed: bool = False) -> dict:
    return {
        "id": str(job.uuid),
        "kind": job.kind,
        "queue": job.queue,
        "state": job.state,
        "title": job.title,
        "progress": job.progress,
        "progress_message": job.progress_message,
        "metrics": listed_metrics(job.metrics) if listed else job.metrics,
        "result": job.result,
        "error": job_error(job),
        "cancel_requested": job.cancel_requested,
        "queue_position": position,
        "submitted_by": job.submitted_by.username if job.submitted_by_id else None,
        "created_at": job.created_at,
        "started_at": job.started_at,
        "finished_at": job.finished_at,
    }
