"""The scorer registry in the admin: read-only (scorers are registered from the dashboard)."""

from django.contrib import admin

from evaluations.models import Scorer


@admin.register(Scorer)
class ScorerAdmin(admin.ModelAdmin):
    list_display = ("name", "filename", "sha256", "size_bytes", "created_by", "created_at")
    search_fields = ("name", "filename", "sha256")
    readonly_fields = [f.name for f in Scorer._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
