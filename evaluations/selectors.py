"""Read-only scorer registry queries."""

from __future__ import annotations

from pathlib import Path

from evaluations.models import Scorer


def scorer_list():
    return Scorer.objects.all().select_related("created_by").order_by("name")


def scorer_get(*, name: str) -> Scorer | None:
    if not isinstance(name, str) or not name:
        return None
    return Scorer.objects.filter(name=name).first()


def scorer_path(*, scorer: Scorer) -> Path:
    return Path(scorer.path)
