"""Manifest-bound artifact downloads (reference-spec §1.6): the bytes re-checked on the open file.

`open_artifact(run, kind)` opens the run directory with O_DIRECTORY|O_NOFOLLOW, then every
component of the manifest's relative `file` (e.g. `environment-evaluation/baseline/summary.json`)
relative to the descriptor of the one before it, each with O_NOFOLLOW (intermediate ones with
O_DIRECTORY too): a symlink, `..`, an absolute or empty component anywhere on the path is refused,
so the file opened always lies inside the run directory. It fstat()s the open descriptor (a regular file of exactly the manifest's bytes, at most 256 MiB), hashes that
descriptor and compares the SHA-256 with the manifest, then rewinds it: the response streams the
very file that was checked. A missing, replaced, oversized, symlinked, truncated or modified file
is 409 `openenv_artifact_integrity_failed`; a kind outside the list or the manifest is 404
`openenv_artifact_not_found`, and a known kind of a run that has not published is 404
`openenv_artifact_not_ready`.
"""

from __future__ import annotations

import hashlib
import os
import stat

from core.errors import KilnError
from openenv.models import OpenEnvRun, RunState
from openenv.runs.selectors import ARTIFACT_KINDS, run_dir_for

MAX_ARTIFACT_BYTES = 256 * 1024 * 1024
CHUNK = 1024 * 1024


def _integrity(run: OpenEnvRun, kind: str, why: str) -> KilnError:
    return KilnError("openenv_artifact_integrity_failed", f"run {run.id} artifact {kind}: {why}", status=409,
                     hint="the published file no longer matches its manifest; collect the run again")


def manifest_entry(run: OpenEnvRun, kind: str) -> dict:
    if kind not in ARTIFACT_KINDS:
        raise KilnError("openenv_artifact_not_found", f"{kind[:64]!r} is not an OpenEnv artifact kind", status=404,
                        hint="kinds: " + ", ".join(ARTIFACT_KINDS))
    entry = next((a for a in run.artifacts or [] if a.get("kind") == kind), None)
    if entry is None:
        if run.state in (RunState.FAILED, RunState.CANCELLED):  # an ended run never publishes: not "not ready"
            raise KilnError("openenv_artifact_not_found", f"run {run.id} ended {run.state} without publishing its "
                            f"{kind}; it never will", status=404,
                            hint=f"see why with kiln openenv status {run.id}; submit a new run to collect again")
        if run.state != RunState.ROLLOUT_READY and run.state != RunState.COMPLETED:
            raise KilnError("openenv_artifact_not_ready", f"run {run.id} is {run.state}; its {kind} is not published",
                            status=404, hint="wait until the run publishes it: a rollout run's artifacts at "
                                             "rollout_ready, a train run's evaluation files at completed "
                                             f"(kiln openenv status {run.id} --follow)")
        raise KilnError("openenv_artifact_not_found", f"run {run.id} published no {kind}", status=404,
                        hint="see the run's artifacts list")
    return entry


def open_artifact(run: OpenEnvRun, kind: str) -> tuple[int, dict]:
    """(an open descriptor positioned at 0, its manifest entry); the caller closes the descriptor."""
    entry = manifest_entry(run, kind)
    name = entry["file"]
    parts = name.split("/") if isinstance(name, str) else []
    if not parts or any(part in ("", ".", "..") or "\0" in part for part in parts):
        raise _integrity(run, kind, "the manifest names no file of the run directory")
    fd = _open_beneath(run, kind, parts)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _integrity(run, kind, f"{name} is not a regular file")
        if info.st_size > MAX_ARTIFACT_BYTES:
            raise _integrity(run, kind, f"{name} holds {info.st_size} bytes, over the {MAX_ARTIFACT_BYTES} limit")
        if info.st_size != entry["bytes"]:
            raise _integrity(run, kind, f"{name} holds {info.st_size} bytes; the manifest says {entry['bytes']}")
        digest = hashlib.sha256()
        read = 0
        while chunk := os.read(fd, CHUNK):
            digest.update(chunk)
            read += len(chunk)
        if read != entry["bytes"] or "sha256:" + digest.hexdigest() != entry["sha256"]:
            raise _integrity(run, kind, f"{name} does not hash to the manifest's {entry['sha256']}")
        os.lseek(fd, 0, os.SEEK_SET)
    except BaseException:
        os.close(fd)
        raise
    return fd, entry


def _open_beneath(run: OpenEnvRun, kind: str, parts: list[str]) -> int:
    """The leaf's descriptor, every component opened relative to its parent's descriptor with O_NOFOLLOW."""
    name = "/".join(parts)
    try:
        directory = os.open(run_dir_for(run), os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise _integrity(run, kind, f"the run directory cannot be opened ({exc.strerror})") from None
    try:
        for index, part in enumerate(parts[:-1]):
            try:
                child = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=directory)
            except FileNotFoundError:
                raise _integrity(run, kind, f"{name} is missing") from None
            except OSError as exc:
                where = "/".join(parts[:index + 1])
                raise _integrity(run, kind, f"{where} cannot be opened safely as a directory ({exc.strerror}; "
                                            "a symlink?)") from None
            os.close(directory)
            directory = child
        try:
            return os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0),
                           dir_fd=directory)
        except FileNotFoundError:
            raise _integrity(run, kind, f"{name} is missing") from None
        except OSError as exc:
            raise _integrity(run, kind, f"{name} cannot be opened safely ({exc.strerror}; a symlink?)") from None
    finally:
        os.close(directory)


def stream(fd: int, size: int):
    """The checked descriptor's bytes (exactly `size` of them), closing it at the end."""
    try:
        left = size
        while left > 0:
            chunk = os.read(fd, min(CHUNK, left))
            if not chunk:
                break
            left -= len(chunk)
            yield chunk
    finally:
        os.close(fd)
