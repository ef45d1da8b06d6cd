"""Receipts: append-only rows of the signed-off facts (training, gates, promotions, approvals).

A row holds the receipt JSON and the sha256 of its RFC 8785 canonical bytes; the JSON file beside
an adapter is the portable copy and must hash to the same digest. Rows are never changed or
deleted once written (save() of an existing row and delete() raise).
"""

from __future__ import annotations

from django.db import models


class ReceiptKind(models.TextChoices):
    TRAIN = "train", "training"
    TRAIN_FAILURE = "train_failure", "failed training"
    POST_EVAL_GATE = "post_eval_gate", "post-eval gate decision"
    ACTIVATION = "activation", "adapter activation"
    PROMOTION = "promotion", "promotion request"
    APPROVAL = "approval", "promotion decision"
    ENVIRONMENT_EVAL = "environment_eval", "OpenEnv environment evaluation"


class AppendOnlyError(Exception):
    """A receipt row cannot be changed or deleted."""


class Receipt(models.Model):
    kind = models.CharField(max_length=32, choices=ReceiptKind.choices)
    subject = models.CharField(max_length=128, db_index=True, help_text="what it is about, e.g. the adapter name")
    schema = models.CharField(max_length=128, blank=True)
    sha256 = models.CharField(max_length=80, db_index=True, help_text="sha256 of the RFC 8785 canonical JSON")
    body = models.JSONField()
    job = models.ForeignKey("jobs.Job", null=True, blank=True, on_delete=models.SET_NULL, related_name="receipts")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-created_at", "-id"]

    def save(self, *args, **kwargs):
        if self.pk is not None:
            raise AppendOnlyError("receipts are append-only")
        super().save(*args, **kwargs)

    def delete(self, *args, **kwargs):
        raise AppendOnlyError("receipts are append-only")

    def __str__(self) -> str:
        return f"{self.kind} receipt for {self.subject} ({self.sha256[:19]})"
