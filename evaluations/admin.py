"""The scorer registry, eval datasets and eval suites in the admin: read-only (they are created
through the API, the CLI and the dashboard, which publish their files with the rows)."""

from django.contrib import admin

from core.admin_base import ReadOnlyAdmin
from evaluations.models import EvalDataset, EvalSuite, Scorer


@admin.register(Scorer)
class ScorerAdmin(ReadOnlyAdmin):
    list_display = ("name", "filename", "sha256", "size_bytes", "created_by", "created_at")
    search_fields = ("name", "filename", "sha256")
    readonly_fields = [f.name for f in Scorer._meta.fields]


@admin.register(EvalDataset)
class EvalDatasetAdmin(ReadOnlyAdmin):
    list_display = ("name", "format", "rows", "corpus_sha256", "split_manifest_sha256")
    search_fields = ("name", "corpus_sha256")
    readonly_fields = [f.name for f in EvalDataset._meta.fields]


@admin.register(EvalSuite)
class EvalSuiteAdmin(ReadOnlyAdmin):
    list_display = ("name", "examples", "suite_hash")
    search_fields = ("name", "suite_hash")
    readonly_fields = [f.name for f in EvalSuite._meta.fields]
