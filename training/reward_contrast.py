"""Whether a GRPO corpus can teach anything: a group whose rewards are all equal has all-zero
advantages, and dynamic sampling (on by default) drops it. A corpus with no group whose rewards
differ is still queued (spec: the run fails `zero_groups` with a receipt), but the submitter is
warned at once instead of learning it from the failed job (the guide's single 47 + 138 task on
the demo model is such a corpus)."""

from __future__ import annotations


def groups_with_reward_contrast(groups: list[dict]) -> int:
    return sum(1 for group in groups if len({c["reward"] for c in group["completions"]}) > 1)


def reward_contrast_warnings(*, with_contrast: int | None, rows: int, dynamic_sampling: bool) -> list[str]:
    if with_contrast is None or with_contrast > 0 or rows == 0:
        return []
    what = ("every group will be dropped by dynamic sampling and the job fail with zero_groups"
            if dynamic_sampling else "every advantage is zero, so training leaves the adapter as it starts")
    return [f"no group's rewards differ (all {rows} group(s) have equal rewards): {what}; improve generation "
            "diversity or the reward shape (more seeds, harder or easier tasks, a graded reward) before "
            "spending a training step"]
