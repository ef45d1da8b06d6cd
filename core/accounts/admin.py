"""API tokens in /admin/: adding one issues a fresh secret (shown once); the hash is never edited."""

from django.contrib import admin, messages

from core.accounts.models import ApiToken
from core.accounts.services import token_issue


@admin.register(ApiToken)
class ApiTokenAdmin(admin.ModelAdmin):
    list_display = ("prefix", "user", "name", "created_at", "last_used_at", "revoked_at")

    def get_fields(self, request, obj=None):
        if obj is None:  # adding: the person chooses who and a label; the secret is generated
            return ("user", "name")
        return ("user", "name", "prefix", "token_hash", "created_at", "last_used_at", "revoked_at")

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return ()
        return ("user", "prefix", "token_hash", "created_at", "last_used_at")

    def save_model(self, request, obj, form, change):
        if change:
            return super().save_model(request, obj, form, change)
        _, secret = token_issue(user=obj.user, name=obj.name, token=obj)
        messages.warning(request, f"Token created for {obj.user}. Copy it now; it is not shown again: {secret}")
