"""Who may cancel or delete work someone else submitted: one rule for jobs, OpenEnv runs, adapters,
datasets and suites, so that a permission granted in /admin/ means the same thing everywhere."""

from __future__ import annotations

from core.errors import KilnError

# The Django permission (on the jobs app's Job model) that lets a user act on others' work.
DELETE_OTHERS_WORK = "jobs.delete_others_jobs"


def check_owner_or_permitted(*, owner_id, user, what: str, code: str) -> None:
    """Another user's work may be cancelled or deleted only with jobs.delete_others_jobs (403 `code`):
    submit_job lets a user cancel or delete their own. Work nobody submitted (anonymous) is anyone's."""
    if owner_id is not None and owner_id != getattr(user, "id", None) and not (
            user is not None and user.has_perm(DELETE_OTHERS_WORK)):
        raise KilnError(code, f"{what} belongs to another user", status=403,
                        hint="ask its owner, or an administrator, who can grant jobs.delete_others_jobs in /admin/")
