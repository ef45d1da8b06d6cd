"""The pinned corpus of each training job: the exact bytes it trains on, read-only under
KILN_HOME/training/snapshots, kept while its adapter's lineage may be re-hashed (verify, promotion
evidence) and removed with a job that published nothing. Jobs on one corpus share its bytes."""

from __future__ import annotations

import contextlib
import os
import stat
import time
import uuid
from pathlib import Path

from django.conf import settings

from core.artifacts import ensure_dir, write_file
from core.content_identity import file_sha256
from core.contracts.groups import AdmittedCorpus


def snapshots_dir() -> Path:
    return ensure_dir(settings.KILN.layout.training_snapshots)


def _shared_snapshot(sha256: str) -> Path:
    return snapshots_dir() / f"sha256-{sha256.removeprefix('sha256:')}.jsonl"


def pin_snapshot(corpus: AdmittedCorpus) -> Path:
    """Pin the admitted corpus as a private read-only file: the job trains on exactly these bytes.

    Jobs on the same corpus share its bytes: each job's file is a hard link to one copy named by the corpus
    digest. That copy is linked only while it is still Kiln's own regular file holding exactly these bytes;
    otherwise a fresh one replaces the name (earlier jobs keep their own inode)."""
    _sweep_orphans()
    shared = _shared_snapshot(corpus.sha256)
    pinned = snapshots_dir() / f"{uuid.uuid4().hex}.jsonl"
    try:
        if not _holds(shared, corpus):
            write_file(shared, corpus.jsonl, mode=0o444)
        os.link(shared, pinned, follow_symlinks=False)
        return pinned
    except OSError:  # a filesystem without hard links, or a race on the shared name: a copy of its own
        _drop_if_unlinked(shared)
        return write_file(pinned, corpus.jsonl, mode=0o444, exclusive=True)


def _holds(shared: Path, corpus: AdmittedCorpus) -> bool:
    """Whether the shared copy is a regular file of ours, read-only, with exactly the corpus's bytes (hashed
    in chunks: a corpus may be hundreds of MiB, already held in memory once)."""
    try:
        info = shared.lstat()
    except OSError:
        return False
    if (not stat.S_ISREG(info.st_mode) or info.st_uid != os.geteuid() or info.st_mode & 0o222
            or info.st_size != len(corpus.jsonl)):
        return False
    return file_sha256(shared) == corpus.sha256


def _sweep_orphans() -> None:
    """Shared copies no job links to (a process killed between writing one and linking it, or before its
    job committed), once old enough that no submission is between those two steps."""
    for shared in snapshots_dir().glob("sha256-*.jsonl"):
        _drop_if_unlinked(shared, older_than_s=600.0)


def unpin_snapshot(path: Path, sha256: str | None) -> None:
    """Remove a job's pinned file, and the shared copy once no job's file links to it any more. (No chmod
    first: the mode belongs to the inode other jobs' files share; the folder's permission is what counts.)"""
    path.unlink(missing_ok=True)
    if sha256:
        _drop_if_unlinked(_shared_snapshot(sha256))


def _drop_if_unlinked(shared: Path, older_than_s: float = 0.0) -> None:
    """Remove a shared copy no job's file links to any more (and last written over `older_than_s` ago)."""
    with contextlib.suppress(OSError):
        info = shared.lstat()
        if info.st_nlink == 1 and time.time() - info.st_mtime >= older_than_s:
            shared.unlink()


def snapshot_discard(job) -> bool:
    """Remove the pinned corpus of a deleted training job that published nothing (failed, cancelled):
    nothing reads it again. A completed job's snapshot stays: its adapter's lineage check
    (`kiln adapters verify`, promotion evidence) re-hashes it. Whether a file was removed."""
    if job.state == "completed":
        return False
    path = Path((job.payload or {}).get("snapshot_path") or "")
    snapshots = settings.KILN.layout.training_snapshots
    if not path.name or path.parent.resolve() != snapshots.resolve() or not path.is_file():
        return False  # only ever a file Kiln pinned itself
    unpin_snapshot(path, ((job.payload or {}).get("training_data") or {}).get("admitted_corpus_sha256"))
    return True
