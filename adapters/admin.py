from django.contrib import admin

from adapters.models import Adapter


@admin.register(Adapter)
class AdapterAdmin(admin.ModelAdmin):
    list_display = ("name", "state", "loaded", "content_sha256", "created_at", "published_at")
    readonly_fields = [f.name for f in Adapter._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
