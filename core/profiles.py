"""Serving profiles are GPU-ownership policies fixed per process; this says what each one admits."""

from __future__ import annotations

from django.conf import settings

from core.errors import KilnError

# What each profile refuses. stable admits everything; maintenance drains inference and evaluation;
# experimental is for backend qualification and admits everything too.
_REFUSED = {"stable": frozenset(), "experimental": frozenset(), "maintenance": frozenset({"inference", "evaluation"})}


def profile_refuses(activity: str) -> str | None:
    """The name of this process's profile when it refuses the activity, else None."""
    profile = settings.KILN.serving_profile
    return profile if activity in _REFUSED[profile] else None


def require_profile_allows(activity: str) -> None:
    """Raise 503 `inference_disabled_by_profile` when this process's profile refuses the activity."""
    profile = settings.KILN.serving_profile
    if activity in _REFUSED[profile]:
        raise KilnError(
            "inference_disabled_by_profile",
            f"the {profile} serving profile refuses {activity}",
            hint="restart the server with the stable profile (KILN_SERVER_SERVING_PROFILE=stable) to run it",
            status=503,
        )
