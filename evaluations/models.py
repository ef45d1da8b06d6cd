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


class EvalDataset(models.Model):
    """A registered evaluation/training dataset. Its files (data.jsonl, manifest.json, identity.json,
    split.json and the three partition files) live in `path` (HomeLayout.eval_dataset(name)); this row
    mirrors the manifest for listing and is written in the transaction that publishes the folder."""

    name = models.CharField(max_length=64, unique=True)
    format = models.CharField(max_length=16)
    description = models.TextField(blank=True)
    path = models.CharField(max_length=500)
    rows = models.PositiveIntegerField(default=0)
    corpus_sha256 = models.CharField(max_length=71)
    normalized_corpus_sha256 = models.CharField(max_length=71)
    split_manifest_sha256 = models.CharField(max_length=71)
    split_config = models.JSONField(default=dict)
    split_counts = models.JSONField(default=dict)
    num_groups = models.PositiveIntegerField(default=0)
    num_sessions = models.PositiveIntegerField(default=0)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="kiln_eval_datasets"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"dataset {self.name} ({self.format}, {self.rows} rows)"


class EvalSuite(models.Model):
    """A registered eval suite: its JSON file (HomeLayout.eval_suite(name)) holds the examples; the
    row carries what lists and gates need (the content hash, the counts, where it came from)."""

    name = models.CharField(max_length=64, unique=True)
    description = models.TextField(blank=True)
    path = models.CharField(max_length=500)
    suite_hash = models.CharField(max_length=71)
    examples = models.PositiveIntegerField(default=0)
    scorer = models.JSONField(default=dict)
    source = models.JSONField(default=dict, blank=True)  # {"kind": "upload"} or the dataset it came from
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="kiln_eval_suites"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["name"]

    def __str__(self) -> str:
        return f"suite {self.name} ({self.examples} examples)"
