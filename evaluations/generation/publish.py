"""Publish a rollout job's files together (all appear, or none changes), after checking the targets.

The publication itself is core.artifacts.publish_together (hidden siblings, fsync, rename, roll
back on failure); this module adds the checks a user's output paths need first (distinct, not one
of the command's inputs, in a writable directory) and turns an OS failure into the rollout error
the CLI prints.
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


def _same_file(a: Path, b: Path) -> bool:
    """One file under two names: the same resolved path (symlinks followed), or, when both exist,
    the same inode (a hard link)."""
    if os.path.realpath(a) == os.path.realpath(b):
        return True
    try:
        return os.path.samefile(a, b)  # compares st_dev and st_ino
    except OSError:  # one of them does not exist (yet)
        return False


def check_not_inputs(outputs: dict[str, Path], inputs: dict[str, Path]) -> None:
    """Refuse an output that is one of the command's inputs ({flag: path} each): publishing it
    would silently replace the tasks, the template or the scorer (losing its execute bit)."""
    for out_flag, output in outputs.items():
        for in_flag, source in inputs.items():
            if _same_file(output, source):
                raise RolloutError("output_conflict", f"{out_flag} {output} is the {in_flag} file; publishing "
                                   "would overwrite that input", hint=f"give {out_flag} another path")


def publish_together(files: list[tuple[Path, bytes]]) -> None:
    """Write every (path, data) atomically as one publication; raise RolloutError on failure."""
    check_targets([path for path, _ in files])
    try:
        publish_files(files)
    except ArtifactError as exc:
        raise RolloutError("publish_failed", str(exc)) from None
