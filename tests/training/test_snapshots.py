"""training.snapshots: jobs on one corpus share one read-only copy of its bytes, and nothing but Kiln's
own regular file with exactly those bytes is ever linked as a job's pinned corpus."""

from __future__ import annotations

import os
import time
from dataclasses import replace

import pytest

from core.contracts.groups import admit_groups
from training.snapshots import pin_snapshot, snapshots_dir

GROUP = {"messages": [{"role": "user", "content": "What is 2 + 3?"}],
         "completions": [{"text": "5", "reward": 1.0}, {"text": "6", "reward": 0.0}]}


@pytest.fixture(autouse=True)
def home(settings, tmp_path):
    settings.KILN = replace(settings.KILN, home=tmp_path / "home")
    return tmp_path / "home"


def _shared(corpus):
    return snapshots_dir() / f"sha256-{corpus.sha256.removeprefix('sha256:')}.jsonl"


def test_a_planted_link_or_an_altered_copy_is_replaced_not_linked(tmp_path):
    corpus = admit_groups([GROUP])
    outside = tmp_path / "mutable.jsonl"
    outside.write_bytes(corpus.jsonl)
    shared = _shared(corpus)
    shared.symlink_to(outside)  # the right bytes, but a file anyone with access to `outside` can change
    pinned = pin_snapshot(corpus)
    assert not shared.is_symlink() and os.stat(pinned).st_ino == os.stat(shared).st_ino
    assert os.stat(pinned).st_ino != os.stat(outside).st_ino and pinned.read_bytes() == corpus.jsonl

    os.chmod(shared, 0o644)  # made writable (and then altered): a fresh copy takes the name
    shared.write_bytes(b'{"tampered": true}\n')
    again = pin_snapshot(corpus)
    assert again.read_bytes() == corpus.jsonl and os.stat(again).st_ino == os.stat(shared).st_ino
    assert pinned.read_bytes() == b'{"tampered": true}\n'  # (the earlier job's own inode: verify catches that)
    assert not os.stat(again).st_mode & 0o222


def test_a_shared_copy_nothing_links_to_is_swept_once_old(tmp_path):
    corpus, other = admit_groups([GROUP]), admit_groups([{**GROUP, "completions": GROUP["completions"][::-1]}])
    pinned = pin_snapshot(corpus)
    pinned.unlink()  # as a kill -9 between writing the copy and committing the job leaves it
    orphan = _shared(corpus)
    assert orphan.exists() and orphan.stat().st_nlink == 1
    pin_snapshot(other)
    assert orphan.exists()  # young: a submission may be between writing and linking it
    old = time.time() - 3600
    os.utime(orphan, (old, old))
    pin_snapshot(other)
    assert not orphan.exists() and _shared(other).exists()
