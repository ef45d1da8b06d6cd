"""Read-only adapter queries."""

from __future__ import annotations

import json
from pathlib import Path

from adapters.models import Adapter, AdapterState


def adapter_list():
    return Adapter.objects.all().select_related("training_job")


def adapter_get(*, name: str) -> Adapter | None:
    return Adapter.objects.filter(name=name).first()


def adapter_published_path(*, name: str) -> Path | None:
    """Directory of a published adapter, for the sampler and warm starts; None if not published."""
    adapter = Adapter.objects.filter(name=name, state=AdapterState.PUBLISHED).first()
    return Path(adapter.path) if adapter and adapter.path else None


def adapter_receipt(*, adapter: Adapter) -> dict | None:
    if not adapter.path:
        return None
    path = Path(adapter.path) / "train_receipt.json"
    return json.loads(path.read_text()) if path.is_file() else None


def adapter_active(*, excluding: str | None = None) -> Adapter | None:
    """The adapter serving now: the most recently published one that is active (None: the base model)."""
    adapters = Adapter.objects.filter(state=AdapterState.PUBLISHED, loaded=True)
    if excluding:
        adapters = adapters.exclude(name=excluding)
    return adapters.order_by("-published_at", "-id").first()
