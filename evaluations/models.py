"""The scorer registry: user scorer programs, stored once under KILN_HOME and referred to by name.

A registered scorer is immutable: its file (KILN_HOME/scorers/<name>/<filename>, mode 0755) and its
sha256 never change, so a job that names a scorer runs exactly the bytes that were registered.
Jobs run it through the sandbox (`evaluations.sandbox`), never directly.
"""

from __future__ import annotations

from django.conf import settings
from django.db import models


class Scorer(models.Model):
    name = models.CharField(max_length=64, unique=True)
    filename = models.CharField(max_length=100)
    path = models.CharField(max_length=500)
    sha256 = models.CharField(max_length=71)  # "sha256:<hex>" of the file's bytes
    size_bytes = models.PositiveIntegerField(default=0)
    description = models.TextField(blank=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="kiln_scorers"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"scorer {self.name} ({self.filename})"
