"""Job rows are the truth about work: Redis only carries wake-ups, a restart recovers from these rows."""

from __future__ import annotations

from uuid import uuid4

from django.conf import settings
from django.db import models


class JobState(models.TextChoices):
    QUEUED = "queued"
    RUNNING = "running"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL_STATES = (JobState.COMPLETED, JobState.FAILED, JobState.CANCELLED)


class Job(models.Model):
    # The auto-increment key gives a strict FIFO order across processes; the public id is the uuid.
    id = models.BigAutoField(primary_key=True)
    uuid = models.UUIDField(default=uuid4, unique=True, editable=False)
    kind = models.CharField(max_length=64, db_index=True)
    queue = models.CharField(max_length=32, db_index=True)
    state = models.CharField(max_length=16, choices=JobState.choices, default=JobState.QUEUED, db_index=True)
    title = models.CharField(max_length=200, blank=True)
    payload = models.JSONField(default=dict, blank=True)
    result = models.JSONField(default=dict, blank=True)
    progress = models.FloatField(default=0.0)
    progress_message = models.CharField(max_length=300, blank=True)
    metrics = models.JSONField(default=dict, blank=True)
    error_code = models.CharField(max_length=64, blank=True)
    error_message = models.TextField(blank=True)
    cancel_requested = models.BooleanField(default=False)
    # Past its point of no return (publishing its result): a cancel can no longer stop it and is
    # refused (409 job_not_cancellable) rather than accepted and then ignored.
    publishing = models.BooleanField(default=False, db_default=False)  # db_default: older code's inserts still work
    worker_id = models.CharField(max_length=100, blank=True)
    submitted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="kiln_jobs"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)
    # Deleting a finished job hides it from the API and pages; the row and its events stay for audit.
    deleted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-id"]
        permissions = [
            ("submit_job", "Can submit work (training, evaluation, OpenEnv runs) and cancel it"),
            ("approve_promotion", "Can approve or reject adapter promotions"),
            ("delete_others_jobs", "Can delete finished jobs that other users submitted"),
        ]

    def __str__(self) -> str:
        return f"{self.kind} {self.uuid} ({self.state})"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES


class JobEvent(models.Model):
    """Append-only history of a job: state changes, progress milestones, log lines."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="events")
    type = models.CharField(max_length=32)
    message = models.CharField(max_length=500, blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["id"]


class WorkerHeartbeat(models.Model):
    """One row per worker process; /health and restart recovery read it."""

    worker_id = models.CharField(max_length=100, primary_key=True)
    hostname = models.CharField(max_length=200)
    pid = models.IntegerField()
    queues = models.JSONField(default=list)
    status = models.JSONField(default=dict, blank=True)
    started_at = models.DateTimeField()
    last_seen = models.DateTimeField(db_index=True)
    stopped = models.BooleanField(default=False)
