"""How far a CLI collection (`kiln openenv rollout`) got when it failed: the collector's progress
labels counted into episodes and complete groups, and the failure said as one line that also says
that nothing was written. No Django, no torch.
"""

from __future__ import annotations

import re

from kiln_project.cli.client import CliError


class CollectionTally:
    """Counts finished episodes and complete groups from the collector's progress callback (labels
    `group G candidate C`), passing each call on to the progress bar, if any."""

    _LABEL = re.compile(r"^group (\d+) candidate \d+$")

    def __init__(self, groups: int, group_size: int, forward=None):
        self.groups, self.group_size, self.forward = groups, group_size, forward
        self.episodes, self.total = 0, groups * group_size
        self.per_group: dict[int, int] = {}

    def __call__(self, done: int, total: int, label: str) -> None:
        self.episodes, self.total = done, total
        match = self._LABEL.match(label)
        if match:
            group = int(match.group(1))
            self.per_group[group] = self.per_group.get(group, 0) + 1
        if self.forward is not None:
            self.forward(done, total, label)

    @property
    def complete_groups(self) -> int:
        return sum(1 for count in self.per_group.values() if count >= self.group_size)


def interrupted_error(exc, tally: CollectionTally) -> CliError:
    """A collection failure as one line that also says how far the collection got and that nothing was
    written (publication writes the three files together or none): the client error alone, e.g.
    `GET /health failed: ConnectError`, does not say that the run stopped, nor what became of the files."""
    stage = getattr(exc, "stage", None)
    if stage not in ("collection", "identity_verification") or "nothing was published" in exc.message:
        return CliError(exc.code, exc.message, exc.hint)  # before any episode, at publication, or an identity change: the message says enough
    if stage == "collection":
        where = (f"the collection was interrupted after {tally.episodes} of {tally.total} episodes "
                 f"({tally.complete_groups} of {tally.groups} groups complete)")
    else:
        where = f"the final check of the environment failed after all {tally.total} episodes"
    hint = "; ".join(part for part in ((exc.hint or "").rstrip(".; "), "then run kiln openenv rollout again") if part)
    return CliError(exc.code, f"{exc.message}; {where}; no files were written", hint)
