"""Atomic publication of the rollouts and summary files (evaluations.generation.publish)."""

from __future__ import annotations

import os

import pytest

from core import artifacts
from evaluations.generation import publish
from evaluations.generation.errors import RolloutError


def listing(directory):
    return sorted(p.name for p in directory.iterdir())


def test_both_files_appear_together(tmp_path):
    publish.publish_together([(tmp_path / "a.jsonl", b"rows\n"), (tmp_path / "a.json", b"{}\n")])
    assert listing(tmp_path) == ["a.json", "a.jsonl"]
    assert (tmp_path / "a.jsonl").read_bytes() == b"rows\n"


def test_existing_files_are_replaced(tmp_path):
    (tmp_path / "a.jsonl").write_bytes(b"old")
    (tmp_path / "a.json").write_bytes(b"old summary")
    publish.publish_together([(tmp_path / "a.jsonl", b"new"), (tmp_path / "a.json", b"new summary")])
    assert (tmp_path / "a.jsonl").read_bytes() == b"new" and (tmp_path / "a.json").read_bytes() == b"new summary"
    assert listing(tmp_path) == ["a.json", "a.jsonl"]


def _fail_on_second_replace(monkeypatch):
    real, calls = os.replace, []

    def replace(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real(src, dst)

    monkeypatch.setattr(publish.os, "replace", replace)


def test_a_failed_second_rename_rolls_back_the_first_and_leaves_no_files(tmp_path, monkeypatch):
    _fail_on_second_replace(monkeypatch)
    with pytest.raises(RolloutError, match="No space left") as err:
        publish.publish_together([(tmp_path / "a.jsonl", b"new"), (tmp_path / "a.json", b"new summary")])
    assert err.value.code == "publish_failed"
    assert listing(tmp_path) == []


def test_a_failed_second_rename_restores_the_previous_files(tmp_path, monkeypatch):
    (tmp_path / "a.jsonl").write_bytes(b"old")
    (tmp_path / "a.json").write_bytes(b"old summary")
    before = {name: (tmp_path / name).stat().st_mtime_ns for name in ("a.jsonl", "a.json")}
    _fail_on_second_replace(monkeypatch)
    with pytest.raises(RolloutError):
        publish.publish_together([(tmp_path / "a.jsonl", b"new"), (tmp_path / "a.json", b"new summary")])
    assert (tmp_path / "a.jsonl").read_bytes() == b"old" and (tmp_path / "a.json").read_bytes() == b"old summary"
    assert {name: (tmp_path / name).stat().st_mtime_ns for name in ("a.jsonl", "a.json")} == before
    assert listing(tmp_path) == ["a.json", "a.jsonl"]


def test_a_failed_write_touches_nothing(tmp_path, monkeypatch):
    (tmp_path / "a.jsonl").write_bytes(b"old")
    real, calls = artifacts._write_synced, []

    def write(path, data, mode):
        calls.append(path)
        if len(calls) == 2:
            raise OSError(5, "Input/output error")
        real(path, data, mode)

    monkeypatch.setattr(artifacts, "_write_synced", write)  # the one publication module
    with pytest.raises(RolloutError, match="Input/output error"):
        publish.publish_together([(tmp_path / "a.jsonl", b"new"), (tmp_path / "a.json", b"{}")])
    assert listing(tmp_path) == ["a.jsonl"] and (tmp_path / "a.jsonl").read_bytes() == b"old"


def test_targets_are_checked_before_any_work(tmp_path):
    with pytest.raises(RolloutError) as err:
        publish.check_targets([tmp_path / "x.jsonl", tmp_path / "." / "x.jsonl"])
    assert err.value.code == "output_conflict"
    with pytest.raises(RolloutError) as err:
        publish.check_targets([tmp_path / "missing" / "x.jsonl", tmp_path / "s.json"])
    assert err.value.code == "output_directory_missing"
    with pytest.raises(RolloutError) as err:
        publish.check_targets([tmp_path, tmp_path / "s.json"])
    assert err.value.code == "output_is_directory"
