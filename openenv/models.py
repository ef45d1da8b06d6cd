"""OpenEnv runs as rows (reference-spec §1.6, §4.9-4.12): the database is the truth about a run.

A run is admitted FIFO by `sequence` (stable, never reused while the row exists); `request` is the
normalized `OpenEnvRunRequest` and `request_digest` its SHA-256 (the idempotency comparison);
`record` is the last `kiln.openenv-run.v5` document written to the run's `run.json`.
"""

from __future__ import annotations

from uuid import uuid4

from django.conf import settings
from django.db import models
from django.db.models import Q


class RunState(models.TextChoices):
    QUEUED = "queued"
    DISCOVERING = "discovering"
    COLLECTING = "collecting"
    REVALIDATING = "revalidating"
    ROLLOUT_READY = "rollout_ready"
    SUBMITTING = "submitting"
    TRAINING_QUEUED = "training_queued"
    TRAINING_RUNNING = "training_running"
    POST_EVALUATING = "post_evaluating"
    ENVIRONMENT_EVALUATING = "environment_evaluating"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


# The collection phase (the run's own `openenv.run` job executes it), then the training phase (the run
# follows its `training.grpo` job and that job's post-eval), then the environment evaluation (its own
# `openenv.environment_eval` job on the control queue). All count against max_active_runs.
COLLECTION_STATES = (RunState.DISCOVERING, RunState.COLLECTING, RunState.REVALIDATING, RunState.SUBMITTING)
TRAINING_STATES = (RunState.TRAINING_QUEUED, RunState.TRAINING_RUNNING, RunState.POST_EVALUATING)
EVALUATION_STATES = (RunState.ENVIRONMENT_EVALUATING,)
ACTIVE_STATES = COLLECTION_STATES + TRAINING_STATES + EVALUATION_STATES
TERMINAL_STATES = (RunState.ROLLOUT_READY, RunState.COMPLETED, RunState.FAILED, RunState.CANCELLED)


class OpenEnvRun(models.Model):
    id = models.UUIDField(primary_key=True, default=uuid4, editable=False)  # the spec's run_id
    sequence = models.BigIntegerField(unique=True)  # stable FIFO admission order
    idempotency_key = models.CharField(max_length=128, null=True, blank=True)
    request_digest = models.CharField(max_length=80)
    request = models.JSONField()
    kind = models.CharField(max_length=16)
    state = models.CharField(max_length=32, choices=RunState.choices, default=RunState.QUEUED, db_index=True)
    stage = models.CharField(max_length=40, blank=True)
    progress = models.JSONField(default=dict, blank=True)
    environments = models.JSONField(default=list, blank=True)  # [kiln.openenv-identity.v1]
    artifacts = models.JSONField(default=list, blank=True)  # manifest: [{kind, file, sha256, bytes}]
    rollout_stats = models.JSONField(null=True, blank=True)
    failure = models.JSONField(null=True, blank=True)  # kiln.openenv-run-failure.v1
    error = models.CharField(max_length=500, blank=True)  # legacy one-line reason (cancellation)
    cancel_requested = models.BooleanField(default=False)
    record = models.JSONField(default=dict, blank=True)  # the run.json content last written
    # kind train: the sealed kiln.openenv-training-contract.v1 and its digest (set at submission),
    # the private behavior-adapter snapshot, the training selection, the training job and its answer.
    training_contract = models.JSONField(null=True, blank=True)
    training_contract_sha256 = models.CharField(max_length=80, blank=True)
    behavior_snapshot = models.JSONField(null=True, blank=True)
    training_selection = models.JSONField(null=True, blank=True)
    training_data = models.JSONField(null=True, blank=True)  # kiln.openenv-training-data.v1
    warnings = models.JSONField(default=list, blank=True)
    training_job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="openenv_training_runs")
    training_submission = models.JSONField(null=True, blank=True)  # the TrainingResponse
    # environment_eval: the status block (`environment_evaluation`, reference-spec §1.6) and its job.
    environment_evaluation = models.JSONField(null=True, blank=True)
    environment_eval_job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.SET_NULL,
                                             related_name="openenv_environment_eval_runs")
    run_dir = models.CharField(max_length=1000, blank=True)
    job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="openenv_runs")
    submitted_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="openenv_runs")
    submitted_at = models.DateTimeField(auto_now_add=True)
    admitted_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-sequence"]
        constraints = [models.UniqueConstraint(fields=["idempotency_key"], condition=Q(idempotency_key__isnull=False),
                                               name="openenv_run_unique_idempotency_key")]

    def __str__(self) -> str:
        return f"openenv run {self.id} ({self.state})"

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES
