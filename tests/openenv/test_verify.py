"""Offline verification: a fresh collection verifies without the network; one changed byte anywhere fails."""

import json
import shutil
import socket

import pytest

from openenv.verify import VerificationError, verify
from tests.openenv.collector_fakes import config_for, run_collection
from tests.openenv.fake_server import FakeServer

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def collection(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("verify")
    with FakeServer() as a, FakeServer() as b:
        config = config_for([a.url, b.url], tmp, groups=2, environment_reset_options=[{"target": 3}, None],
                            max_steps=3)
        run_collection(config)
    return config


@pytest.fixture
def copy(collection, tmp_path):
    """A private copy of the three files (the summary's paths still name the originals)."""
    paths = {}
    for name, source in (("dataset", collection.output_path), ("replay", collection.replay_output_path),
                         ("summary", collection.summary_output_path)):
        paths[name] = tmp_path / source.name
        shutil.copy(source, paths[name])
    return paths


def check(paths):
    return verify(paths["summary"], dataset_path=paths["dataset"], replay_path=paths["replay"])


def test_a_fresh_collection_verifies_offline(collection, copy, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("verify touched the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    report = check(copy).report
    assert report["schema"] == "kiln.openenv-verification.v1"
    assert report["groups"] == 2 and report["rollouts"] == 4 and report["environment_exchanges"] > 0
    assert verify(collection.summary_output_path).report["dataset_sha256"] == report["dataset_sha256"]


@pytest.mark.parametrize("name", ["dataset", "replay", "summary"])
def test_one_changed_byte_in_any_file_is_named(copy, name):
    path = copy[name]
    original = path.read_bytes()
    positions = sorted({*range(0, len(original), max(1, len(original) // 40)), len(original) - 1})
    for position in positions:
        changed = bytearray(original)
        changed[position] ^= 0x01
        path.write_bytes(bytes(changed))
        with pytest.raises(VerificationError) as info:
            check(copy)
        assert info.value.code == "openenv_verification_failed" and info.value.where
    path.write_bytes(original)
    check(copy)


def test_the_first_inconsistency_is_named(copy):
    data = copy["dataset"].read_bytes()
    copy["dataset"].write_bytes(data.replace(b'"reward":', b'"reward": ', 1))
    with pytest.raises(VerificationError) as info:
        check(copy)
    assert info.value.where == "dataset (bytes)"
    copy["dataset"].write_bytes(data)

    summary = json.loads(copy["summary"].read_text())
    summary["stats"]["done_count"] += 1
    copy["summary"].write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    with pytest.raises(VerificationError) as info:
        check(copy)
    assert info.value.where == "summary.stats.done_count"

    summary["stats"]["done_count"] -= 1
    summary["kiln_url"] = "http://elsewhere:8420"
    copy["summary"].write_text(json.dumps(summary, indent=2, ensure_ascii=False) + "\n")
    with pytest.raises(VerificationError) as info:
        check(copy)
    assert info.value.where == "summary (configuration)"

    summary["kiln_url"] = json.loads(copy["summary"].read_text())["kiln_url"]
    copy["summary"].write_text(json.dumps(summary, indent=1) + "\n")
    with pytest.raises(VerificationError) as info:
        check(copy)
    assert "canonical form" in info.value.message


def test_the_reset_plan_is_reconstructed(collection, copy):
    summary = json.loads(copy["summary"].read_text())
    from core.canonical import json_digest

    assert summary["reset_plan_sha256"] == json_digest([{"target": 3}, {}])


def test_an_archived_copy_is_checked_against_its_own_files(collection, copy, capsys):
    """With --summary alone, the files beside the summary are the ones checked, not the stored paths."""
    from kiln_project.cli.main import main

    originals = [collection.output_path, collection.replay_output_path]
    report = verify(copy["summary"]).report
    assert report["dataset_path"] == str(copy["dataset"].resolve())
    assert report["replay_path"] == str(copy["replay"].resolve())

    for name in ("replay", "dataset"):
        original = copy[name].read_bytes()
        changed = bytearray(original)
        changed[len(original) // 2] ^= 0x01
        copy[name].write_bytes(bytes(changed))
        with pytest.raises(VerificationError):
            verify(copy["summary"])
        assert main(["openenv", "verify", "--summary", str(copy["summary"])]) == 1
        assert "openenv_verification_failed" in capsys.readouterr().err
        copy[name].write_bytes(original)

    # the originals gone, the untampered archive still verifies (and the output names the copies)
    moved = [path.rename(path.with_name(path.name + ".away")) for path in originals]
    try:
        assert main(["openenv", "verify", "--summary", str(copy["summary"])]) == 0
        out = capsys.readouterr().out
        assert str(copy["dataset"].resolve()) in out and str(copy["replay"].resolve()) in out
    finally:
        for away, path in zip(moved, originals, strict=True):
            away.rename(path)
