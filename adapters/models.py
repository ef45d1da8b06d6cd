"""An adapter row per versioned name. Its files live in KILN_HOME/adapters/<name>/ once published."""

from __future__ import annotations

from django.db import models


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
    created_at = models.DateTimeField(auto_now_add=True)
    published_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]

    def __str__(self) -> str:
        return f"{self.name} ({self.state})"
