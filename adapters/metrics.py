"""The adapters app's gauge for GET /metrics (core.metrics): promotions by state, so a team can alert
on candidates waiting for an approver. Read from the rows at scrape time; no label names an adapter."""

from __future__ import annotations

from core.metrics.gauges import register_gauge


def _promotions_by_state() -> dict[tuple[str, ...], float]:
    from django.db.models import Count

    from adapters.models import Promotion

    return {(row["state"],): row["n"] for row in Promotion.objects.values("state").annotate(n=Count("id"))}


def register_families() -> None:
    from adapters.models import PromotionState

    register_gauge("kiln_promotions", "Adapter promotions by state (pending ones wait for an approver).",
                   _promotions_by_state, state=tuple(PromotionState.values))
