"""/v1/config: the effective configuration of this process (no secrets)."""

from __future__ import annotations

from django.conf import settings
from ninja import Router

from core.jobs.kinds import registered_kinds

router = Router(tags=["system"])


@router.get("config", summary="The effective configuration")
def get_config(request):
    return {
        "config": settings.KILN.public_dict(),
        "serving_profile": settings.KILN.serving_profile,
        "job_kinds": [{"name": k.name, "queue": k.queue, "category": k.category} for k in registered_kinds()],
    }
