"""Adapters in /admin/: read-only, they change through training and promotion only."""

from django.contrib import admin

from adapters.models import Adapter
from core.admin_base import ReadOnlyAdmin


@admin.register(Adapter)
class AdapterAdmin(ReadOnlyAdmin):
    list_display = ("name", "state", "loaded", "content_sha256", "created_at", "published_at")
    readonly_fields = [f.name for f in Adapter._meta.fields]
