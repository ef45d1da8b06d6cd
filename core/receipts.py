"""Record receipts as rows (service) and read them back (selectors). Call inside the transaction
that publishes what the receipt describes, so the row and the thing appear together."""

from __future__ import annotations

from core.canonical import json_digest
from core.models import Receipt


def receipt_record(*, kind: str, subject: str, body: dict, job=None) -> Receipt:
    """Append a receipt row; its sha256 is over the canonical JSON of `body`."""
    schema = str(body.get("schema") or body.get("schema_version") or "")
    return Receipt.objects.create(kind=kind, subject=subject, schema=schema, sha256=json_digest(body),
                                  body=body, job=job)


def receipt_latest(*, kind: str, subject: str) -> Receipt | None:
    return Receipt.objects.filter(kind=kind, subject=subject).order_by("-created_at", "-id").first()
