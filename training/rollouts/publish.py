"""Publish several files together, atomically: all appear, or none changes. Pure module (os only).

Each file is written to a hidden sibling (`.<name>.<random>.tmp`), flushed and fsynced; then the
siblings are renamed over their targets one after another. Before a target is replaced, its old
content is kept as a hidden hard link (`.<name>.<random>.bak`), so when a later rename fails the
earlier ones are rolled back: the old file comes back, or the new one is removed when there was
none. Directories are fsynced after the renames. Readers never see a half-written file, and a
failure leaves the previous outputs exactly as they were.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from training.rollouts.errors import RolloutError


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
        if not os.access(path.parent, os.W_OK | os.X_OK):
            raise RolloutError("output_not_writable", f"cannot write in {path.parent}")
    return resolved


def _sibling(path: Path, suffix: str) -> Path:
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.{suffix}")


def _write_synced(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _unlink_quietly(path: Path | None) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def publish_together(files: list[tuple[Path, bytes]]) -> None:
    """Write every (path, data) atomically as one publication; raise RolloutError on failure."""
    targets = check_targets([path for path, _ in files])
    temps: list[Path] = []
    backups: list[Path | None] = []
    replaced: list[tuple[Path, Path | None]] = []  # (target, backup of its old content or None)
    try:
        for target, (_, data) in zip(targets, files, strict=True):
            temp = _sibling(target, "tmp")
            temps.append(temp)
            _write_synced(temp, data)
        for target in targets:
            backup = _sibling(target, "bak") if os.path.lexists(target) else None
            backups.append(backup)
            if backup is not None:
                try:
                    os.link(target, backup)
                except OSError:  # no hard links here: keep a copy instead
                    _write_synced(backup, target.read_bytes())
        for target, temp, backup in zip(targets, temps, backups, strict=True):
            os.replace(temp, target)
            replaced.append((target, backup))
    except BaseException as exc:
        for target, backup in reversed(replaced):
            try:
                if backup is not None:
                    os.replace(backup, target)
                else:
                    os.unlink(target)
            except OSError:
                pass
        for temp in temps:
            _unlink_quietly(temp)
        for backup in backups:
            _unlink_quietly(backup)
        if not isinstance(exc, OSError):
            raise
        raise RolloutError("publish_failed", f"could not publish {', '.join(str(t) for t in targets)}: {exc}; "
                           "the previous files were left as they were") from None
    for backup in backups:
        _unlink_quietly(backup)
    for directory in {t.parent for t in targets}:
        _fsync_dir(directory)
