"""An adapter row per versioned name. Its files live in KILN_HOME/adapters/<name>/ once published."""

from __future__ import annotations

from django.conf import settings
from django.db import models
from django.utils import timezone


class AdapterState(models.TextChoices):
    WRITING = "writing"  # reserved by a queued or running training job
    PUBLISHED = "published"


class Adapter(models.Model):
    name = models.CharField(max_length=64, unique=True)
    state = models.CharField(max_length=16, choices=AdapterState.choices, default=AdapterState.WRITING)
    path = models.CharField(max_length=500, blank=True)
    content_sha256 = models.CharField(max_length=80, blank=True)
    base_model_sha256 = models.CharField(max_length=80, blank=True)
    base_adapter = models.CharField(max_length=64, blank=True)
    training_job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="adapters")
    loaded = models.BooleanField(default=False)  # activated for serving (auto_load or promotion)
    # A serving canary failed on it (adapters.canary): never activated again without allow_quarantined.
    quarantined = models.BooleanField(default=False)
    canary = models.JSONField(null=True, blank=True)  # the last serving canary's record (kiln.serving-canary.v1)
    # The adapter_manifest.json it was published with (its file sha256; empty: none), so that verify can
    # tell a deleted or replaced manifest from an adapter that never had one.
    manifest_sha256 = models.CharField(max_length=80, blank=True)
    # Uploaded (POST /v1/adapters/upload): trained elsewhere, its receipt (if any) carried in the archive.
    uploaded = models.BooleanField(default=False)
    created_at = models.DateTimeField(auto_now_add=True)
    published_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"


class AdapterStatus(models.TextChoices):
    """The states an adapter's history names (AdapterTransition.to_state) and the API's `status`."""

    WRITING = "writing"  # reserved; a training job is writing it
    AVAILABLE = "available"  # published, on disk, not active
    ACTIVE = "active"  # published and active for serving (`loaded`)
    QUARANTINED = "quarantined"  # a serving canary failed on it; loading it needs allow_quarantined
    FAILED = "failed"  # its training failed, or a gate demoted it
    DELETED = "deleted"  # removed by hand (its receipts stay)


class AdapterTransitionError(Exception):
    """A transition row cannot be changed or deleted."""


class AdapterTransition(models.Model):
    """One change of an adapter's state: who, when, why. Append-only (save() of an existing row and
    delete() raise), keyed by name so the history outlives the adapter row."""

    adapter = models.CharField(max_length=64, db_index=True)
    from_state = models.CharField(max_length=16, blank=True)  # "" for the first transition
    to_state = models.CharField(max_length=16, choices=AdapterStatus.choices)
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="adapter_transitions")
    reason = models.TextField(blank=True)
    job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.SET_NULL,
                            related_name="adapter_transitions")
    content_sha256 = models.CharField(max_length=80, blank=True)  # the adapter's digest at the time
    at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["at", "id"]

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise AdapterTransitionError("adapter transitions are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AdapterTransitionError("adapter transitions are append-only")

    def __str__(self) -> str:
        return f"{self.adapter}: {self.from_state or '-'} → {self.to_state}"


class PromotionState(models.TextChoices):
    PENDING = "pending"  # waits for a person holding jobs.approve_promotion
    APPROVED = "approved"  # decided; its activation job runs the serving canary, then applies it (or fails)
    REJECTED = "rejected"
    APPLIED = "applied"  # the candidate became the active adapter
    SUPERSEDED = "superseded"  # another promotion for the same incumbent was applied first, or its candidate was made active otherwise
    FAILED = "failed"  # approved, but activating the candidate failed (the reason says why)


class Promotion(models.Model):
    """A request to make `candidate` the active adapter in place of `incumbent` (None: the base model),
    with the evidence a reviewer decides on and its canonical digest (adapters.promotions)."""

    candidate = models.CharField(max_length=64, db_index=True)
    content_sha256 = models.CharField(max_length=80)  # the candidate's bytes when requested
    incumbent = models.CharField(max_length=64, null=True, blank=True)  # active when requested
    incumbent_sha256 = models.CharField(max_length=80, blank=True)
    evidence = models.JSONField(default=dict)
    evidence_sha256 = models.CharField(max_length=80)
    alarms = models.JSONField(default=list)  # reward-hacking reasons; non-empty: never applied automatically
    state = models.CharField(max_length=16, choices=PromotionState.choices, default=PromotionState.PENDING,
                             db_index=True)
    requested_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="promotions_requested")
    requested_at = models.DateTimeField(default=timezone.now)
    request_reason = models.TextField(blank=True)
    job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="promotions")
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="promotions_decided")
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)  # the decision's reason (or why it was superseded or failed)
    activation_job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.SET_NULL,
                                       related_name="activated_promotions")

    class Meta:
        ordering = ["-requested_at", "-id"]

    def __str__(self) -> str:
        return f"promotion {self.id}: {self.incumbent or 'base'} → {self.candidate} ({self.state})"
