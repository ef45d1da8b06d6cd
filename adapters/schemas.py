"""API shapes of adapters."""

from __future__ import annotations

from core.models import ReceiptKind
from core.receipts import receipt_latest


def adapter_out(adapter) -> dict:
    receipt = receipt_latest(kind=ReceiptKind.TRAIN, subject=adapter.name)
    return {
        "name": adapter.name,
        "state": adapter.state,
        "path": adapter.path or None,
        "content_sha256": adapter.content_sha256 or None,
        "base_model_sha256": adapter.base_model_sha256 or None,
        "base_adapter": adapter.base_adapter or None,
        "loaded": adapter.loaded,
        "training_job_id": str(adapter.training_job.uuid) if adapter.training_job_id else None,
        "created_at": adapter.created_at,
        "published_at": adapter.published_at,
        "receipt_sha256": receipt.sha256 if receipt else None,  # the receipt row; the file hashes the same
    }
