"""Registry reads for templates that show a stored record beside the state of things now: which
adapter serves, whether a job a record links to still exists, and whether promotion needs approval. Through the apps' selectors only;
reads, never decisions. (The presentation filters without database access are in `kiln_ui`.)
"""

from __future__ import annotations

from django import template

register = template.Library()


@register.simple_tag
def serving_adapter() -> str:
    """The adapter serving now, or "base" (the base model): a gate's evidence records what the gate
    allowed back then, and a reviewer or an approval may have changed what serves since."""
    from adapters.selectors import adapter_active

    active = adapter_active()
    return active.name if active else "base"


@register.filter
def job_live(job_id) -> bool:
    """Whether a job's page can show it: evidence keeps the id of a job deleted since, and a link
    to it would answer 404."""
    from core.jobs.selectors import job_get

    return job_get(job_id=str(job_id)) is not None


@register.simple_tag
def promotion_needs_approval() -> bool:
    """Whether an activation asked for now becomes a promotion request a reviewer approves
    (`[promotion] require_approval`, on by default with more than one user)."""
    from adapters.promotions import approval_required

    return approval_required()
