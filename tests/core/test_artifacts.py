"""The one artifact layer: a reader sees the old state or the new one, never half, even after kill -9."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core import artifacts

REPO = Path(__file__).resolve().parents[2]


def visible(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if not p.name.startswith("."))


def test_write_file_replaces_atomically_and_keeps_the_mode(tmp_path):
    target = tmp_path / "a.json"
    artifacts.write_json(target, {"v": 1})
    artifacts.write_json(target, {"v": 2}, mode=0o600)
    assert target.read_text() == '{\n  "v": 2\n}\n'
    assert oct(target.stat().st_mode & 0o777) == "0o600"
    assert os.listdir(tmp_path) == ["a.json"]
    with pytest.raises(ValueError):
        artifacts.write_json(target, {"v": float("nan")})
    assert target.read_text() == '{\n  "v": 2\n}\n'


def test_publish_directory_refuses_an_occupied_target_unless_replacing(tmp_path):
    final = tmp_path / "model"
    artifacts.publish_directory(final, lambda d: (d / "w").write_text("one"))
    with pytest.raises(FileExistsError):
        artifacts.publish_directory(final, lambda d: (d / "w").write_text("two"))
    artifacts.publish_directory(final, lambda d: (d / "w").write_text("two"), replace=True)
    assert (final / "w").read_text() == "two"
    assert os.listdir(tmp_path) == ["model"]


def test_a_failing_fill_leaves_the_old_folder_and_no_staging(tmp_path):
    final = tmp_path / "model"
    artifacts.publish_directory(final, lambda d: (d / "w").write_text("old"))

    def broken(staging: Path) -> None:
        (staging / "w").write_text("half")
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        artifacts.publish_directory(final, broken, replace=True)
    assert (final / "w").read_text() == "old" and os.listdir(tmp_path) == ["model"]


def test_publish_together_rolls_back_when_a_rename_fails(tmp_path, monkeypatch):
    a, b = tmp_path / "a", tmp_path / "b"
    artifacts.publish_together([(a, b"a1"), (b, b"b1")])
    real_replace = os.replace
    calls = []

    def failing_replace(src, dst):
        calls.append(dst)
        if Path(dst) == b and len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    monkeypatch.setattr(artifacts.os, "replace", failing_replace)
    with pytest.raises(artifacts.ArtifactError):
        artifacts.publish_together([(a, b"a2"), (b, b"b2")])
    assert (a.read_bytes(), b.read_bytes()) == (b"a1", b"b1")
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


WRITER = """
import sys, time
from pathlib import Path
from core.artifacts import publish_directory
final, n = Path(sys.argv[1]), int(sys.argv[2])
def fill(staging):
    for i in range(200):
        (staging / f"part-{i:03d}").write_text(str(n) * 4096)
    print("filled", flush=True)
    time.sleep(float(sys.argv[3]))
publish_directory(final, fill, replace=True)
print("published", flush=True)
"""


@pytest.mark.parametrize("pause", [0.0, 5.0])
def test_kill_9_while_publishing_a_folder_leaves_the_old_state_or_the_new_one(tmp_path, pause):
    final = tmp_path / "artifact"
    artifacts.publish_directory(final, lambda d: [(d / f"part-{i:03d}").write_text("0" * 4096) for i in range(200)])
    script = tmp_path / "writer.py"
    script.write_text(WRITER)
    for round_ in range(1, 6):
        proc = subprocess.Popen(
            [sys.executable, str(script), str(final), str(round_), str(pause)],
            cwd=REPO, stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONPATH=str(REPO)),
        )
        assert proc.stdout.readline().strip() == "filled"
        time.sleep(0.002 * round_)  # kill at different points of the fsync/rename sequence
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        assert visible(tmp_path) == ["artifact", "writer.py"]
        contents = {(final / name).read_text() for name in os.listdir(final)}
        assert len(os.listdir(final)) == 200 and len(contents) == 1, "a mix of two publications"
        assert next(iter(contents))[0] in "012345"


def test_an_output_that_is_a_fifo_or_a_directory_is_refused_and_left_as_it_was(tmp_path):
    # An atomic rename over a device would replace it with a plain file: `--summary-output /dev/null`
    # run as root once turned this machine's /dev/null into a regular file.
    import stat

    from kiln_project.cli.client import CliError
    from kiln_project.cli.output import check_output_path

    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    folder = tmp_path / "folder"
    folder.mkdir()
    other = tmp_path / "other.json"
    for target in (fifo, folder):
        with pytest.raises(artifacts.ArtifactError, match="not a file"):
            artifacts.write_file(target, b"x")
        with pytest.raises(artifacts.ArtifactError, match="not a file"):
            artifacts.publish_together([(other, b"{}"), (target, b"x")])
        with pytest.raises(CliError) as caught:
            check_output_path(target)
        assert caught.value.code == "output_not_a_file"
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode) and folder.is_dir() and not other.exists()
    assert set(tmp_path.iterdir()) == {fifo, folder}  # nothing staged is left behind
    # a regular file and a symlink are still replaced
    (tmp_path / "file").write_text("old")
    artifacts.write_file(tmp_path / "file", b"new")
    (tmp_path / "link").symlink_to(tmp_path / "file")
    artifacts.publish_together([(tmp_path / "link", b"linked")])
    assert (tmp_path / "link").read_bytes() == b"linked" and not (tmp_path / "link").is_symlink()


def test_what_an_interrupted_writer_left_is_removed_and_nothing_else(tmp_path):
    from core.artifacts import remove_abandoned_staging

    (tmp_path / "math-r001").mkdir()
    (tmp_path / "math-r001-checkpoint-step-00000002.kiln-checkpoint").mkdir()
    staging = tmp_path / ".math-r001-checkpoint-step-00000003.kiln-checkpoint.7a1cd794bc2a.staging"
    staging.mkdir()
    (staging / ".incomplete").write_text("")
    (tmp_path / ".train_receipt.json.0123456789ab.tmp").write_text("{")
    (tmp_path / ".math-r000.0123456789ab.retired").mkdir()
    (tmp_path / ".keep.0123456789ab.bak").write_text("x")  # a pair's backup: recovery may need it
    removed = remove_abandoned_staging(tmp_path)
    assert sorted(p.name for p in removed) == sorted([staging.name, ".train_receipt.json.0123456789ab.tmp",
                                                      ".math-r000.0123456789ab.retired"])
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        ".keep.0123456789ab.bak", "math-r001", "math-r001-checkpoint-step-00000002.kiln-checkpoint"]
    assert remove_abandoned_staging(tmp_path / "missing") == []
