"""Atomic publication of files and folders that other processes read. Pure module: os only.

Every writer of a file that someone else reads (adapters, checkpoints, models, rollouts,
receipts, run artifacts) goes through here, so a reader sees the old state or the new one and
never half of either:
- a file is written to a hidden sibling, flushed and fsynced, renamed over its target, and the
  directory is fsynced;
- a folder is filled in a hidden sibling (`StagedDirectory`), every file and the folder are
  fsynced, then it is renamed into place (or swapped with the folder it replaces), and the
  parent is fsynced;
- several files that belong together are published all-or-nothing (`publish_together`).
A failure leaves the previous state untouched and removes what it staged.
"""

from __future__ import annotations

import ctypes
import errno
import json
import logging
import os
import secrets
import shutil
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


class ArtifactError(OSError):
    """Publication failed; the previous state was left as it was."""


def check_replaceable(path: Path) -> None:
    """Refuse (ArtifactError) to publish over anything but a regular file or a symlink: an atomic
    rename would put a plain file in place of a device, a FIFO or a socket (`--output /dev/null`
    run as root would replace the machine's /dev/null)."""
    try:
        kind = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise ArtifactError(f"cannot publish {path}: {exc}") from None
    if not (stat.S_ISREG(kind) or stat.S_ISLNK(kind)):
        what = "a directory" if stat.S_ISDIR(kind) else "a device, FIFO or socket"
        raise ArtifactError(f"{path} is {what}, not a file: name a file path for the output")


def hidden_sibling(path: Path, suffix: str) -> Path:
    """`.<name>.<random>.<suffix>` next to `path`: never mistaken for a finished artifact."""
    path = Path(path)
    return path.with_name(f".{path.name}.{secrets.token_hex(6)}.{suffix}")


def retire_directory(folder: Path) -> Path | None:
    """Rename `folder` to a hidden `.retired` sibling (which the caller removes; a crash before that
    leaves it to remove_abandoned_staging). None when there is no such folder, or it cannot be moved
    (then it stays where it is, and the log says so)."""
    folder = Path(folder)
    if not folder.is_dir() or folder.is_symlink():
        return None
    retired = hidden_sibling(folder, "retired")
    try:
        os.rename(folder, retired)
    except OSError as exc:
        log.warning("could not move %s out of the way: %s", folder, exc)
        return None
    log.warning("removed %s (written, never registered)", folder)
    return retired


def remove_abandoned_staging(directory: Path) -> list[Path]:
    """Remove the `.<name>.<random>.staging` / `.tmp` / `.retired` entries a writer killed mid-write left in
    `directory` (never offered as artifacts, but they hold disk). Call only when no writer can be
    running there (`kiln serve` before it starts its workers); returns what was removed."""
    directory = Path(directory)
    if not directory.is_dir():
        return []
    removed = []
    for entry in directory.iterdir():
        if entry.name.startswith(".") and entry.name.endswith((".staging", ".tmp", ".retired")) and not entry.is_symlink():
            if entry.is_dir():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)
            removed.append(entry)
    return removed


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file and folder under `root` (files first, folders bottom-up)."""
    for dirpath, _dirnames, filenames in os.walk(root, topdown=False):
        for name in filenames:
            path = os.path.join(dirpath, name)
            if not os.path.islink(path):
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        fsync_dir(Path(dirpath))


def _write_synced(path: Path, data: bytes, mode: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view):]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.chmod(path, mode)  # the umask may have narrowed it


def write_file(path: Path, data: bytes, *, mode: int = 0o644, exclusive: bool = False) -> Path:
    """Publish `data` at `path` atomically, replacing what was there, or with `exclusive` refusing
    (FileExistsError) a path that already exists."""
    path = Path(path)
    check_replaceable(path)
    temp = hidden_sibling(path, "tmp")
    try:
        _write_synced(temp, data, mode)
        if exclusive:
            os.link(temp, path)  # fails if the path exists; the name appears with the whole content
            os.unlink(temp)
        else:
            os.replace(temp, path)
    except BaseException:
        _unlink_quietly(temp)
        raise
    fsync_dir(path.parent)
    return path


def write_json(path: Path, value: Any, *, mode: int = 0o644) -> Path:
    """Pretty JSON plus a newline, published atomically; NaN and infinities are refused."""
    text = json.dumps(value, indent=2, allow_nan=False) + "\n"
    return write_file(path, text.encode(), mode=mode)


def json_bytes(value: Any) -> bytes:
    """The bytes `write_json` writes (for files staged inside a `StagedDirectory`)."""
    return (json.dumps(value, indent=2, allow_nan=False) + "\n").encode()


class StagedDirectory:
    """A folder filled in a hidden sibling of `final`, invisible until `publish()`.

    `replace=False` refuses a `final` that exists and is not an empty folder (checked when
    staging begins and again at publication); `replace=True` swaps the old folder out only once
    the new one is complete.
    """

    def __init__(self, final: Path, *, replace: bool = False):
        self.final = Path(final)
        self.replace = replace
        self._check_target()
        self.final.parent.mkdir(parents=True, exist_ok=True)
        self.staging = hidden_sibling(self.final, "staging")
        self.staging.mkdir()

    def _check_target(self) -> None:
        final = self.final
        if os.path.islink(final) or (final.exists() and not final.is_dir()):
            raise FileExistsError(f"{final} exists and is not a folder")
        if final.is_dir() and any(final.iterdir()) and not self.replace:
            raise FileExistsError(f"{final} exists and is not empty")

    def publish(self) -> Path:
        try:
            fsync_tree(self.staging)
            self._check_target()
            if self.final.exists():
                _swap_into_place(self.staging, self.final)  # self.staging now holds the old folder
                fsync_dir(self.final.parent)
                shutil.rmtree(self.staging, ignore_errors=True)
            else:
                os.rename(self.staging, self.final)
                fsync_dir(self.final.parent)
        except BaseException:
            self.discard()
            raise
        return self.final

    def discard(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)

    def __enter__(self) -> StagedDirectory:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None:
            self.discard()


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def _swap_into_place(new: Path, final: Path) -> None:
    """Exchange two folders in one step (Linux renameat2 RENAME_EXCHANGE): a crash at any point
    leaves `final` either the old folder or the new one. Where the call is missing, two renames
    (with a short window in which `final` is absent) are the fallback."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        renameat2 = None
    if renameat2 is not None:
        result = renameat2(_AT_FDCWD, os.fsencode(new), _AT_FDCWD, os.fsencode(final), _RENAME_EXCHANGE)
        if result == 0:
            return
        err = ctypes.get_errno()
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err), str(final))
    retired = hidden_sibling(final, "retired")
    os.rename(final, retired)
    try:
        os.rename(new, final)
    except BaseException:
        os.rename(retired, final)
        raise
    os.rename(retired, new)


def publish_directory(final: Path, fill: Callable[[Path], None], *, replace: bool = False) -> Path:
    """Stage a folder, let `fill(staging)` write into it, then publish it atomically."""
    with StagedDirectory(final, replace=replace) as staged:
        fill(staged.staging)
        return staged.publish()


def _unlink_quietly(path: Path | None) -> None:
    if path is not None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def publish_together(files: list[tuple[Path, bytes]], *, mode: int = 0o644) -> None:
    """Publish every (path, data) as one: all new files appear, or none of the old ones changed.

    Each file goes to a hidden sibling first; the old content of each target is kept as a hidden
    hard link (or copy) until every rename succeeded, so a failing rename rolls the earlier ones
    back. Raises ArtifactError (the previous files left as they were) on an OS failure.
    """
    targets = [Path(os.path.abspath(path)) for path, _ in files]
    for target in targets:
        check_replaceable(target)
    temps: list[Path] = []
    backups: list[Path | None] = []
    replaced: list[tuple[Path, Path | None]] = []
    try:
        for target, (_, data) in zip(targets, files, strict=True):
            temp = hidden_sibling(target, "tmp")
            temps.append(temp)
            _write_synced(temp, data, mode)
        for target in targets:
            backup = hidden_sibling(target, "bak") if os.path.lexists(target) else None
            backups.append(backup)
            if backup is not None:
                try:
                    os.link(target, backup)
                except OSError:  # no hard links on this filesystem: keep a copy instead
                    _write_synced(backup, target.read_bytes(), mode)
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
        for path in [*temps, *backups]:
            _unlink_quietly(path)
        if not isinstance(exc, OSError):
            raise
        names = ", ".join(str(t) for t in targets)
        raise ArtifactError(f"could not publish {names}: {exc}; the previous files were left as they were") from None
    for backup in backups:
        _unlink_quietly(backup)
    for directory in {t.parent for t in targets}:
        fsync_dir(directory)


CHECKPOINT_SUFFIX = ".kiln-checkpoint"  # <adapter>-checkpoint-step-<8 digits>.kiln-checkpoint/
CHECKPOINT_MANIFEST = "checkpoint_manifest.json"


def checkpoint_folder(registry: Path, value: str) -> Path | None:
    """The checkpoint folder a `resume_checkpoint` names (a basename in the adapter registry, or an
    absolute path directly beneath it), or None when it names none."""
    path = Path(value)
    if path.is_absolute():
        if path.parent.resolve() != Path(registry).resolve():
            return None
    elif path.name != value or value in (".", ".."):
        return None
    else:
        path = Path(registry) / value
    if not path.name.endswith(CHECKPOINT_SUFFIX) or path.is_symlink() or not path.is_dir():
        return None
    return path


def describe_checkpoint(path: Path) -> dict[str, Any]:
    """The job detail's `latest_checkpoint` object (reference-spec §1.1) from a checkpoint's manifest.
    Reads the manifest only (the GPU worker's loader verifies every file). Raises OSError, ValueError
    or KeyError for a manifest it cannot read."""
    path = Path(path)
    manifest = json.loads((path / CHECKPOINT_MANIFEST).read_text())
    progress, data = manifest["progress"], manifest["data"]
    return {
        "resume_checkpoint": path.name,
        "checkpoint_id": manifest["checkpoint_id"],
        "training_kind": manifest["training_kind"],
        "data_source_kind": data["source_kind"],
        "global_step": progress["global_step"],
        "total_steps": progress["total_steps"],
        "next_epoch_index": progress["epoch_index"],
        "next_cursor_in_epoch": progress["cursor_in_epoch"],
        "complete": progress["global_step"] >= progress["total_steps"],
        "created_at": manifest["created_at"],
        "effective_config": manifest["effective_config"],
        "data_content_sha256": data["content_sha256"],
        "data_item_count": data["item_count"],
    }


class HomeLayout:
    """Every location under KILN_HOME, named once. Paths only: callers create what they write into."""

    def __init__(self, root: Path):
        self.root = Path(root)

    @property
    def adapters(self) -> Path:
        """The adapter registry: `<name>/` folders and their `<name>-checkpoint-step-N.kiln-checkpoint/`."""
        return self.root / "adapters"

    def checkpoint(self, value: str) -> Path | None:
        return checkpoint_folder(self.adapters, value)

    @property
    def tiny_model(self) -> Path:
        return self.root / "models" / "tiny"

    @property
    def training_snapshots(self) -> Path:
        """Pinned, read-only copies of admitted training corpora."""
        return self.root / "training" / "snapshots"

    def failure_receipt(self, job_id: str) -> Path:
        """Where a training job that failed after admission leaves its receipt."""
        return self.root / "training" / "receipts" / f"{job_id}.train_receipt.json"

    @property
    def rollouts(self) -> Path:
        return self.root / "rollouts"

    def rollouts_job(self, job_id: str) -> Path:
        """One folder per rollout-generation job: its pinned inputs and published outputs."""
        return self.rollouts / str(job_id)

    @property
    def eval_datasets(self) -> Path:
        """Registered eval datasets (spec §1.4): `<adapter_dir>/.eval/datasets/<name>/`."""
        return self.adapters / ".eval" / "datasets"

    def eval_dataset(self, name: str) -> Path:
        return self.eval_datasets / name

    @property
    def eval_suites(self) -> Path:
        """Registered eval suites: `<adapter_dir>/.eval/suites/<name>.json`."""
        return self.adapters / ".eval" / "suites"

    def eval_suite(self, name: str) -> Path:
        return self.eval_suites / f"{name}.json"

    @property
    def evals(self) -> Path:
        """Eval jobs: `<job uuid>/results.json` (published once, atomically, when a job completes)
        and `inputs/<id>/suite.json` (the read-only suite copy a job was pinned to at submission)."""
        return self.root / "evals"

    def eval_job(self, job_id: str) -> Path:
        return self.evals / str(job_id)

    @property
    def scorers(self) -> Path:
        return self.root / "scorers"

    @property
    def datasets(self) -> Path:
        return self.root / "datasets"

    @property
    def database(self) -> Path:
        """The default SQLite database (when DATABASE_URL names none)."""
        return self.root / "kiln.sqlite3"

    @property
    def secret_key(self) -> Path:
        """The generated Django secret key (when KILN_SECRET_KEY is not set)."""
        return self.root / "secret_key"

    @property
    def redis_socket(self) -> Path:
        """The private Redis `kiln serve` starts (when KILN_REDIS_URL names none)."""
        return self.root / "redis" / "redis.sock"

    @property
    def static(self) -> Path:
        return self.root / "static"

    @property
    def cli_token(self) -> Path:
        """The token ./scripts/serve saves for this machine's CLI."""
        return self.root / "cli-token"

    @property
    def locks(self) -> Path:
        """Process locks (core.process_locks): the GPU device, the one `kiln serve` per home."""
        return self.root / "locks"

    def run_artifacts(self, run_id: str) -> Path:
        """Artifacts of one OpenEnv run."""
        return self.root / "openenv" / "runs" / str(run_id)


def ensure_dir(path: Path) -> Path:
    Path(path).mkdir(parents=True, exist_ok=True)
    return Path(path)
