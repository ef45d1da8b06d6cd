"""Adapter state changes: reserve a name for a training job, publish it, release it on failure."""

from __future__ import annotations

import re
from pathlib import Path

from django.conf import settings
from django.db import IntegrityError, transaction
from django.utils import timezone

from adapters.models import Adapter, AdapterState
from core.artifacts import ensure_dir
from core.errors import KilnError

NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def adapters_root() -> Path:
    return ensure_dir(settings.KILN.layout.adapters)


def validate_adapter_name(name: str, *, field: str = "output_name") -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name) or name == "base" or ".." in name:
        raise KilnError("invalid_adapter_name", f"{field}: {name!r} is not a valid adapter name", status=400, field=field,
                        hint="use letters, digits, '.', '_' and '-' (at most 64), e.g. math-r001")
    return name


def adapter_reserve(*, name: str, job=None, base_adapter: str = "") -> Adapter:
    """Claim a new versioned name for a job. A name in use answers adapter_revision_conflict."""
    validate_adapter_name(name)
    existing = Adapter.objects.filter(name=name).first()
    if existing is not None:
        raise KilnError(
            "adapter_revision_conflict",
            f"adapter {name!r} is already {'being written' if existing.state == AdapterState.WRITING else 'published'}",
            hint="use a new versioned output name for every round, e.g. math-r002", status=409)
    try:
        with transaction.atomic():
            return Adapter.objects.create(name=name, state=AdapterState.WRITING, training_job=job,
                                          base_adapter=base_adapter)
    except IntegrityError:
        raise KilnError("adapter_revision_conflict", f"adapter {name!r} was reserved concurrently", status=409,
                        hint="use a new versioned output name") from None


def adapter_publish(*, name: str, path: Path, content_sha256: str, base_model_sha256: str, loaded: bool) -> Adapter:
    updated = Adapter.objects.filter(name=name, state=AdapterState.WRITING).update(
        state=AdapterState.PUBLISHED, path=str(path), content_sha256=content_sha256,
        base_model_sha256=base_model_sha256, loaded=loaded, published_at=timezone.now())
    if not updated:
        raise KilnError("adapter_revision_conflict", f"adapter {name!r} is no longer reserved", status=409)
    return Adapter.objects.get(name=name)


def adapter_release(*, name: str) -> None:
    """Forget a reservation whose job failed or was cancelled, so the name can be used again.

    Publication is atomic (hidden sibling, then rename), so a failed job left no adapter files."""
    Adapter.objects.filter(name=name, state=AdapterState.WRITING).delete()


def adapter_activate(*, name: str) -> Adapter:
    """Mark a published adapter active for serving (auto_load, or a passed post-eval gate)."""
    updated = Adapter.objects.filter(name=name, state=AdapterState.PUBLISHED).update(loaded=True)
    if not updated:
        raise KilnError("adapter_not_found", f"no published adapter named {name!r}", status=404)
    return Adapter.objects.get(name=name)


def adapter_demote(*, name: str) -> Path | None:
    """A gate found the adapter below the floor with confidence: it leaves the registry and its folder
    is renamed `<name>.failed` (kept for audit, never served). Returns the new folder."""
    adapter = Adapter.objects.filter(name=name).first()
    if adapter is None:
        return None
    moved = None
    if adapter.path and Path(adapter.path).is_dir():
        target = Path(adapter.path).with_name(f"{name}.failed")
        suffix = 1
        while target.exists():
            suffix += 1
            target = Path(adapter.path).with_name(f"{name}.failed.{suffix}")
        Path(adapter.path).rename(target)
        moved = target
    adapter.delete()
    return moved
