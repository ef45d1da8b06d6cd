"""The scorer registry in the admin: read-only (scorers are registered from the dashboard)."""

from django.contrib import admin

from core.admin_base import ReadOnlyAdmin
from evaluations.models import Scorer


@admin.register(Scorer)
class ScorerAdmin(ReadOnlyAdmin):
    list_display = ("name", "filename", "sha256", "size_bytes", "created_by", "created_at")
    search_fields = ("name", "filename", "sha256")
    readonly_fields = [f.name for f in Scorer._meta.fields]
