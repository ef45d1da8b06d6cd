"""The team rules every app shares: who may cancel or delete work someone else submitted (jobs,
OpenEnv runs, adapters, datasets, suites), and when a promotion needs an approver, so that a
permission granted in /admin/ means the same thing everywhere."""

from __future__ import annotations

from django.conf import settings

from core.errors import KilnError

# The Django permissions (on the jobs app's Job model) that let a user act on others' work, and
# approve a promotion (which then changes what serves).
DELETE_OTHERS_WORK = "jobs.delete_others_jobs"
APPROVE_PROMOTION = "jobs.approve_promotion"


def team_exists() -> bool:
    """More than one active user: others' work and what serves are then a team's to govern."""
    from django.contrib.auth import get_user_model

    return get_user_model().objects.filter(is_active=True).count() > 1


def approval_required() -> bool:
    """`[promotion] require_approval`; unset: on whenever more than one active user exists."""
    configured = getattr(settings.KILN, "promotion_require_approval", None)
    if configured is not None:
        return bool(configured)
    return team_exists()


def check_owner_or_permitted(*, owner_id, user, what: str, code: str) -> None:
    """Another user's work may be cancelled or deleted only with jobs.delete_others_jobs (403 `code`):
    submit_job lets a user cancel or delete their own. Work nobody submitted (anonymous) is anyone's."""
    if owner_id is not None and owner_id != getattr(user, "id", None) and not (
            user is not None and user.has_perm(DELETE_OTHERS_WORK)):
        raise KilnError(code, f"{what} belongs to another user", status=403,
                        hint="ask its owner, or an administrator, who can grant jobs.delete_others_jobs in /admin/")
