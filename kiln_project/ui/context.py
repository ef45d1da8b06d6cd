"""Template context shared by every page."""

from django.conf import settings


def kiln_context(request):
    return {"kiln_serving_profile": settings.KILN.serving_profile}
