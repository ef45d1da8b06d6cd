"""Receipts in /admin/: read-only, searchable by adapter, job and digest, with the policy audit shown readably."""

import json

from django.contrib import admin
from django.utils.html import format_html, format_html_join

from core.admin_base import ReadOnlyAdmin
from core.models import Receipt


@admin.register(Receipt)
class ReceiptAdmin(ReadOnlyAdmin):
    list_display = ("created_at", "kind", "subject", "short_sha256", "job")
    list_filter = ("kind",)
    search_fields = ("subject", "sha256", "job__uuid")
    fields = ("kind", "subject", "schema", "sha256", "job", "created_at", "policy_audit", "summary", "pretty_body")
    readonly_fields = fields

    @admin.display(description="sha256")
    def short_sha256(self, obj):
        return obj.sha256[:19] + "…"

    @admin.display(description="policy audit")
    def policy_audit(self, obj):
        audit = ((obj.body or {}).get("grpo") or {}).get("policy_audit")
        if not isinstance(audit, dict):
            return "—"
        return _table(audit)

    @admin.display(description="summary")
    def summary(self, obj):
        body = obj.body or {}
        rows = {
            "adapter": (body.get("adapter") or {}).get("name") if isinstance(body.get("adapter"), dict) else None,
            "training data": body.get("training_data"),
            "rewards": body.get("rewards"),
            "steps": body.get("progress"),
            "fallbacks": body.get("fallbacks"),
            "warnings": body.get("warnings"),
        }
        return _table({k: v for k, v in rows.items() if v not in (None, [], {})})

    @admin.display(description="receipt JSON")
    def pretty_body(self, obj):
        return format_html("<pre style='white-space:pre-wrap'>{}</pre>", json.dumps(obj.body, indent=2))


def _table(mapping: dict):
    rows = format_html_join(
        "", "<tr><th style='text-align:left;padding-right:1em'>{}</th><td>{}</td></tr>",
        ((key, _cell(value)) for key, value in mapping.items()),
    )
    return format_html("<table>{}</table>", rows)


def _cell(value) -> str:
    if isinstance(value, dict | list):
        return json.dumps(value, sort_keys=True)
    return str(value)
