"""Adapters in /admin/: read-only, they change through training and promotion only."""

from django.contrib import admin

from adapters.models import Adapter, AdapterTransition, Promotion
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


@admin.register(Promotion)
class PromotionAdmin(ReadOnlyAdmin):
    list_display = ("id", "candidate", "incumbent", "state", "requested_by", "requested_at", "decided_by",
                    "decided_at")
    list_filter = ("state",)
    readonly_fields = [f.name for f in Promotion._meta.fields]
