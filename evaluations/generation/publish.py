"""Publish a rollout job's files together (all appear, or none changes), after checking the targets.

The publication itself is core.artifacts.publish_together (hidden siblings, fsync, rename, roll
back on failure); this module adds the checks a user's output paths need first and turns an OS
failure into the rollout error the CLI prints.
"""

from __future__ import annotations

import os
from pathlib import Path

from core.artifacts import ArtifactError, check_replaceable
from core.artifacts import publish_together as publish_files
from evaluations.generation.errors import RolloutError


def check_targets(paths: list[Path]) -> list[Path]:
    """Absolute, distinct targets whose directories exist (checked before any work is done)."""
    resolved = [Path(os.path.abspath(p)) for p in paths]
    if len({os.path.realpath(p) for p in resolved}) != len(resolved):
        raise RolloutError("output_conflict", "the output files must be different paths: "
                           + ", ".join(str(p) for p in resolved))
    for path in resolved:
        if not path.parent.is_dir():
            raise RolloutError("output_directory_missing", f"the directory of {path} does not exist")
        if path.is_dir():
            raise RolloutError("output_is_directory", f"{path} is a directory")
        try:
            check_replaceable(path)  # a device, FIFO or socket would be replaced by a plain file
        except ArtifactError as exc:
            raise RolloutError("output_not_a_file", str(exc)) from None
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise RolloutError("output_not_writable", f"cannot write in {path.parent}")
    return resolved


def publish_together(files: list[tuple[Path, bytes]]) -> None:
    """Write every (path, data) atomically as one publication; raise RolloutError on failure."""
    check_targets([path for path, _ in files])
    try:
        publish_files(files)
    except ArtifactError as exc:
        raise RolloutError("publish_failed", str(exc)) from None
