"""Adapters in /admin/: read-only, they change through training and promotion only. Auditors see the
registry, the append-only history of transitions and the promotions with their decisions here; the
receipts (requests, approvals, activations) are core.admin's Receipt, read-only too."""

from django.contrib import admin

from adapters.models import Adapter, AdapterTransition, Promotion
from core.admin_base import ReadOnlyAdmin


@admin.register(Adapter)
class AdapterAdmin(ReadOnlyAdmin):
    list_display = ("name", "state", "loaded", "quarantined", "base_adapter", "content_sha256", "training_job",
                    "created_at", "published_at")
    list_filter = ("state", "loaded", "quarantined")
    search_fields = ("name", "content_sha256", "base_adapter")
    readonly_fields = [f.name for f in Adapter._meta.fields]


@admin.register(AdapterTransition)
class AdapterTransitionAdmin(ReadOnlyAdmin):
    list_display = ("at", "adapter", "from_state", "to_state", "actor", "reason", "job")
    list_filter = ("to_state",)
    search_fields = ("adapter", "reason", "content_sha256")
    readonly_fields = [f.name for f in AdapterTransition._meta.fields]


@admin.register(Promotion)
class PromotionAdmin(ReadOnlyAdmin):
    list_display = ("id", "candidate", "incumbent", "state", "flagged", "requested_by", "requested_at", "decided_by",
                    "decided_at", "reason")
    list_filter = ("state",)
    search_fields = ("candidate", "incumbent", "evidence_sha256", "content_sha256")
    readonly_fields = [f.name for f in Promotion._meta.fields]

    @admin.display(boolean=True, description="alarm")
    def flagged(self, obj):
        return bool(obj.alarms)
