"""A request's server-side path is read only inside a root, and never in KILN_HOME's private files,
whichever roots are configured (core.confined_paths, pure)."""

from __future__ import annotations

import pytest

from core.confined_paths import PathRefused, confined_file


@pytest.fixture
def home(tmp_path):
    home = tmp_path / "home"
    (home / "rollouts").mkdir(parents=True)
    (home / "secret_key").write_text("s3cret")
    (home / "kiln.sqlite3").write_bytes(b"SQLite format 3\x00")
    (home / "adapters" / ".eval").mkdir(parents=True)
    (home / "adapters" / ".eval" / "holdout.jsonl").write_text("{}\n")
    (home / "rollouts" / "math-r001.rollouts.jsonl").write_text("{}\n")
    return home


def test_a_root_that_is_kiln_home_itself_opens_none_of_its_private_files(home):
    """`kiln serve` started inside KILN_HOME makes the launch folder, KILN_HOME, a root."""
    roots = (home / "rollouts", home)
    for private in ("secret_key", "kiln.sqlite3", "adapters/.eval/holdout.jsonl"):
        with pytest.raises(PathRefused):
            confined_file(str(home / private), roots, private=home)
    rollouts = home / "rollouts" / "math-r001.rollouts.jsonl"
    assert confined_file(str(rollouts), roots, private=home) == rollouts.resolve()


def test_a_root_above_kiln_home_still_reads_the_users_own_files(home, tmp_path):
    mine = tmp_path / "math-r001.rollouts.jsonl"
    mine.write_text("{}\n")
    assert confined_file(str(mine), (tmp_path,), private=home) == mine.resolve()
    with pytest.raises(PathRefused):
        confined_file(str(home / "secret_key"), (tmp_path,), private=home)
