"""`kiln openenv inspect|tasks|rollout|verify`: a typo'd URL, a server without a Task API, a missing file
and an output folder that is not there each get their own one line before any work; and `verify --summary`
checks the files the user downloaded beside the summary (`<stem>.rollouts.jsonl`, `<stem>.replay.json`),
saying plainly when it checked the recorded (server's) copies instead."""

from __future__ import annotations

import json
import shutil
import socket

import pytest

from kiln_project.cli.main import main
from tests.openenv.collector_fakes import config_for, run_collection
from tests.openenv.fake_server import FakeServer

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(autouse=True)
def _no_debug(monkeypatch):
    monkeypatch.delenv("KILN_DEBUG", raising=False)


@pytest.fixture
def offline(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the command touched the network")

    monkeypatch.setattr(socket.socket, "connect", refuse)


def _run(capsys, *argv):
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("command", ["inspect", "tasks"])
@pytest.mark.parametrize("url", ["notaurl", "example.com"])
def test_a_bare_word_is_not_an_environment_url(capsys, offline, command, url):
    code, out, err = _run(capsys, "openenv", command, url)
    assert (code, out) == (1, "")
    assert err == (f"error: openenv_invalid_url: {url!r} is not an environment URL (hint: give "
                   "http(s)://HOST[:PORT][/PATH] or HOST:PORT, e.g. http://127.0.0.1:8990)\n")


def test_rollout_refuses_a_bare_word_before_collecting(capsys, offline, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, _, err = _run(capsys, "openenv", "rollout", "--environment", "notaurl", "--url", "http://127.0.0.1:9")
    assert code == 1 and err.startswith("error: openenv_invalid_url: 'notaurl' is not an environment URL")


def test_tasks_on_a_server_without_a_task_api_says_so(capsys):
    with FakeServer() as server:  # it answers 404 for /{env}/splits
        code, out, err = _run(capsys, "openenv", "tasks", server.url)
    assert (code, out) == (1, "")
    assert err == (f"error: openenv_invalid_task_selection: {server.url.rstrip('/')} has no Task API (GET splits "
                   "answered 404) (hint: the Task API is optional: collection does not need it; kiln openenv "
                   "inspect URL shows what the server offers)\n")
    assert "no --split" not in err


@pytest.mark.parametrize("flag", [[], ["--summary"]])
def test_verify_of_a_missing_summary_names_the_file(capsys, offline, tmp_path, flag):
    missing = tmp_path / "nosuch.json"
    code, _, err = _run(capsys, "openenv", "verify", *flag, str(missing))
    assert code == 1
    assert err == (f"error: file_not_found: the summary {missing} does not exist (hint: give the rollout summary "
                   "JSON the collection wrote (e.g. openenv.rollout-summary.json))\n")


@pytest.mark.parametrize("output", ["--output", "--replay-output", "--summary-output"])
def test_rollout_checks_the_output_folder_before_collecting(capsys, tmp_path, monkeypatch, output):
    import openenv.collector

    async def never(*args, **kwargs):
        raise AssertionError("collected although an output folder is missing")

    monkeypatch.setattr(openenv.collector, "collect_and_publish", never)
    monkeypatch.chdir(tmp_path)
    target = tmp_path / "missing" / "dir" / "x.jsonl"
    code, _, err = _run(capsys, "openenv", "rollout", "--environment", "http://127.0.0.1:9",
                        "--url", "http://127.0.0.1:9", output, str(target))
    assert code == 1
    assert err == (f"error: output_folder_not_found: the folder {target.parent} for {target} does not exist "
                   "(hint: create it first, or choose another output path)\n")


# --- verify: the user's downloads beside the summary ----------------------------------------------------

@pytest.fixture(scope="module")
def server_run(tmp_path_factory):
    """A collection as a server run stores it: rollouts.jsonl, replay.json, summary.json in the run folder."""
    run_dir = tmp_path_factory.mktemp("home") / "adapters" / ".openenv" / "runs" / "run-1"
    run_dir.mkdir(parents=True)
    with FakeServer() as server:
        config = config_for([server.url], run_dir, groups=2, max_steps=3, output_path=run_dir / "rollouts.jsonl",
                            replay_output_path=run_dir / "replay.json", summary_output_path=run_dir / "summary.json")
        run_collection(config)
    return config


@pytest.fixture
def downloads(server_run, tmp_path):
    """What `kiln openenv artifact RUN dataset|replay|summary --output counter.*` leaves in a folder."""
    paths = {"dataset": tmp_path / "counter.rollouts.jsonl", "replay": tmp_path / "counter.replay.json",
             "summary": tmp_path / "counter.rollout-summary.json"}
    for name, source in (("dataset", server_run.output_path), ("replay", server_run.replay_output_path),
                         ("summary", server_run.summary_output_path)):
        shutil.copy(source, paths[name])
    return paths


def _flip(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_verify_checks_the_downloads_beside_the_summary(capsys, offline, downloads):
    code, out, err = _run(capsys, "openenv", "verify", "--summary", str(downloads["summary"]))
    assert (code, err) == (0, "")
    lines = out.splitlines()
    assert lines[1].split()[-1] == str(downloads["dataset"].resolve())
    assert lines[2].split()[-1] == str(downloads["replay"].resolve())
    assert "note:" not in out


@pytest.mark.parametrize("name", ["dataset", "replay"])
def test_a_tampered_download_fails_even_though_the_server_copies_are_intact(capsys, offline, downloads, name):
    _flip(downloads[name])
    code, out, err = _run(capsys, "openenv", "verify", "--summary", str(downloads["summary"]))
    assert code == 1 and out == ""
    assert err.startswith(f"error: openenv_verification_failed: {name}") and len(err.splitlines()) == 1, err
    assert f"(checked dataset {downloads['dataset']}, replay {downloads['replay']})" in err  # which files it chose


def test_the_summarys_own_downloads_win_over_a_stray_file_of_the_recorded_name(capsys, offline, downloads,
                                                                               server_run):
    from pathlib import Path

    stray = downloads["summary"].parent / Path(server_run.output_path).name  # e.g. an older rollouts.jsonl
    stray.write_text('{"not": "this run"}\n')
    code, out, err = _run(capsys, "openenv", "verify", "--summary", str(downloads["summary"]))
    assert (code, err) == (0, "") and out.splitlines()[1].split()[-1] == str(downloads["dataset"].resolve())


def test_verify_says_when_it_checked_the_server_copies(capsys, offline, downloads, server_run):
    downloads["dataset"].unlink()
    downloads["replay"].unlink()
    code, out, _ = _run(capsys, "openenv", "verify", "--summary", str(downloads["summary"]))
    assert code == 0
    assert out.splitlines()[:2] == [
        f"note: checked the server's copy of the dataset at its recorded path {server_run.output_path}, not a "
        "file beside the summary (pass --dataset FILE to check your own)",
        f"note: checked the server's copy of the replay at its recorded path {server_run.replay_output_path}, not "
        "a file beside the summary (pass --replay FILE to check your own)"]
    assert out.splitlines()[3].split()[-1] == str(server_run.output_path.resolve())


def test_verify_names_a_dataset_that_is_nowhere(capsys, offline, downloads, server_run, tmp_path):
    downloads["dataset"].unlink()
    away = server_run.output_path.rename(tmp_path / "away.jsonl")
    try:
        code, out, err = _run(capsys, "openenv", "verify", "--summary", str(downloads["summary"]))
    finally:
        away.rename(server_run.output_path)
    assert (code, out) == (1, "")
    assert err == (f"error: file_not_found: the summary's dataset is neither beside {downloads['summary']} "
                   f"(rollouts.jsonl or counter.rollouts.jsonl) nor at its recorded path {server_run.output_path} "
                   "(hint: pass --dataset FILE)\n")


def test_an_explicit_dataset_that_is_missing_is_named(capsys, offline, downloads, tmp_path):
    missing = tmp_path / "gone.jsonl"
    code, _, err = _run(capsys, "openenv", "verify", "--summary", str(downloads["summary"]), "--dataset", str(missing))
    assert code == 1
    assert err == (f"error: file_not_found: the dataset {missing} does not exist (hint: give the collection's "
                   "dataset file)\n")


def _catalog(monkeypatch, *, start, tasks, total=250):
    import openenv.client.tasks as tasks_module

    async def fake(endpoint, **kwargs):
        return {"environment_name": "words", "base_url": endpoint.base_url, "task_api": "supported",
                "splits": ["train"], "split": "train", "start": start, "num_tasks": total, "tasks": tasks}

    monkeypatch.setattr(tasks_module, "task_catalog", fake)


def test_tasks_past_the_end_of_a_split_is_an_error_not_an_empty_page(capsys, monkeypatch):
    _catalog(monkeypatch, start=300, tasks=[])
    code, out, err = _run(capsys, "openenv", "tasks", "http://127.0.0.1:9", "--split", "train", "--start", "300")
    assert code == 1 and "tasks 300..300" not in out
    assert err == ("error: openenv_invalid_task_selection: --start 300 is past the end of split 'train', which has "
                   "250 tasks (hint: use --start 0..249)\n")


def test_tasks_text_shows_non_ascii_as_it_is_and_control_characters_never(capsys, monkeypatch):
    _catalog(monkeypatch, start=0, tasks=[{"word": "über", "note": "a\x1b[2Jb"}])
    code, out, _ = _run(capsys, "openenv", "tasks", "http://127.0.0.1:9", "--split", "train")
    assert code == 0 and '"word": "über"' in out and "\\u00fc" not in out and "\x1b" not in out


def test_an_archive_beside_the_summary_is_never_mixed_with_the_servers_copy(tmp_path):
    """`--output zs.jsonl --replay-output zs.replay.json --summary-output zs.summary.json`, archived:
    the dataset is found by the plain stem; with it missing, the server's copy is not checked
    against the archived replay (a tampered archive passed that way)."""
    from argparse import Namespace

    from kiln_project.cli.client import CliError
    from kiln_project.cli.openenv_artifact_paths import artifact_paths

    server = tmp_path / "home" / "adapters" / ".openenv" / "runs" / "r1"
    server.mkdir(parents=True)
    (server / "rollouts.jsonl").write_text("{}\n")
    (server / "replay.json").write_text("{}")
    archive = tmp_path / "arch"
    archive.mkdir()
    summary = archive / "zs.summary.json"
    summary.write_text(json.dumps({"output_path": str(server / "rollouts.jsonl"),
                                   "replay_output_path": str(server / "replay.json")}))
    (archive / "zs.replay.json").write_text("{}")
    (archive / "zs.jsonl").write_text("{}\n")
    args = Namespace(summary=summary, summary_file=None, dataset=None, replay=None)
    assert artifact_paths(args) == (summary, archive / "zs.jsonl", archive / "zs.replay.json", [])
    (archive / "zs.jsonl").unlink()
    with pytest.raises(CliError) as refused:
        artifact_paths(args)
    assert refused.value.code == "file_not_found"
    assert "the replay is beside" in refused.value.message and str(server / "rollouts.jsonl") in refused.value.message
    assert refused.value.hint.startswith("pass --dataset FILE")
    (archive / "zs.replay.json").unlink()  # nothing archived: the recorded copies, with notes
    _, dataset, replay, notes = artifact_paths(args)
    assert (dataset, replay) == (server / "rollouts.jsonl", server / "replay.json") and len(notes) == 2


def test_rollout_under_the_maintenance_profile_stops_before_any_environment_is_contacted(monkeypatch, capsys):
    """Spec audit: every episode's action comes from the server's chat route, which the maintenance profile
    refuses; the collection discovered and reset the environment first, then failed at the first action."""
    import httpx

    from kiln_project.cli import client as client_module
    from tests.cli.recording_server import serve_commands

    contacted = []
    monkeypatch.setattr("openenv.collector.collect_and_publish", lambda *a, **k: contacted.append(a))
    recorder = serve_commands(monkeypatch, [client_module], lambda request: httpx.Response(
        200, json={"status": "ok", "serving_profile": "maintenance", "inference": {"available": False}}))
    code, out, err = _run(capsys, "openenv", "rollout", "--environment", "http://127.0.0.1:9", "--groups", "1")
    assert code == 1 and not contacted
    assert err.startswith("error: inference_disabled_by_profile: the maintenance serving profile refuses inference")
    assert recorder.requests == [("GET", "/health")]
