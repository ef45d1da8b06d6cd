"""A --url that answers 200 JSON but is not Kiln (QA: `kiln jobs list` said `unexpected_error: TypeError`,
`adapters download` saved the stub's JSON as an archive and exited 0): one line naming the server."""

from __future__ import annotations

import httpx
import pytest

from kiln_project.cli import adapters_cmd, client, jobs_cmd
from tests.cli.recording_server import run_cli, serve_commands


@pytest.fixture
def json_stub(monkeypatch):
    monkeypatch.setattr(client, "last_answered_by", None)
    return serve_commands(monkeypatch, [jobs_cmd, adapters_cmd],
                          lambda request: httpx.Response(200, json={"foo": 1}))


@pytest.mark.parametrize("argv", [("jobs", "list"), ("jobs", "show", "0b9f3c1e-0000-4000-8000-000000000000"),
                                  ("adapters", "show", "math-r001")])
def test_an_answer_without_kilns_fields_is_named_not_a_python_error(json_stub, capsys, argv):
    code, _, err = run_cli(capsys, *argv)
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1, err
    assert lines[0].startswith("error: unexpected_answer: the answer from http://kiln.test is not what Kiln's API "
                               "sends ("), lines


def test_a_download_from_another_server_is_refused_and_nothing_is_saved(json_stub, capsys, tmp_path):
    out = tmp_path / "dl.tgz"
    code, _, err = run_cli(capsys, "adapters", "download", "math-r001", "--output", str(out))
    assert code == 1 and err.startswith("error: not_a_kiln_server: http://kiln.test answered 200 OK"), err
    assert not out.exists() and not list(tmp_path.iterdir())
