"""Adapters in /admin/: read-only, they change through training and promotion only."""

from django.contrib import admin

from adapters.models import Adapter, AdapterTransition
from core.admin_base import ReadOnlyAdmin


@admin.register(Adapter)
class AdapterAdmin(ReadOnlyAdmin):
    list_display = ("name", "state", "loaded", "content_sha256", "created_at", "published_at")
    readonly_fields = [f.name for f in Adapter._meta.fields]


@admin.register(AdapterTransition)
class AdapterTransitionAdmin(ReadOnlyAdmin):
    list_display = ("adapter", "from_state", "to_state", "actor", "reason", "at")
    list_filter = ("to_state",)
    readonly_fields = [f.name for f in AdapterTransition._meta.fields]
