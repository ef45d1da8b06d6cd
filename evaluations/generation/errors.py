"""The one error type of `kiln rollout-generate`'s pure core. Imports nothing from Kiln.

Every failure names where it happened (task id, seed) and what was checked, so the command can
print one line a user can act on.
"""

from __future__ import annotations


class RolloutError(Exception):
    """A refusal or a failed check. `code` is stable; `check` names the validation that failed."""

    def __init__(self, code: str, message: str, *, task_id: str | None = None, seed: int | None = None,
                 check: str | None = None, hint: str = ""):
        self.code, self.task_id, self.seed, self.check, self.hint = code, task_id, seed, check, hint
        where = []
        if task_id is not None:
            where.append(f"task {task_id!r}")
        if seed is not None:
            where.append(f"seed {seed}")
        if check is not None:
            where.append(f"check {check}")
        self.message = (", ".join(where) + ": " if where else "") + one_line(message)
        super().__init__(self.message)


def one_line(text: str, limit: int = 2000) -> str:
    """Collapse newlines so an error stays one line; keep the end when it is long (stderr tails)."""
    flat = " | ".join(part.strip() for part in str(text).splitlines() if part.strip())
    return flat if len(flat) <= limit else "..." + flat[-limit:]
