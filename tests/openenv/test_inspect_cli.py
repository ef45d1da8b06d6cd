"""`kiln openenv inspect|tasks` against the fake server: the summary, --json, one-line typed errors."""

import json

from kiln_project.cli.main import main
from tests.openenv.fake_server import FakeServer, counter_documents


def test_inspect_prints_the_summary_and_hashes(capsys):
    documents = counter_documents()
    documents["/metadata"]["description"] = "counter \x1b[31mred\x1b[0m"
    with FakeServer(documents=documents) as server:
        assert main(["openenv", "inspect", "--environment", server.url]) == 0
    out = capsys.readouterr().out
    assert "counter 0.1.0" in out and f"ws://127.0.0.1:{server.port}/ws" in out
    assert "openenv-http/1.x" in out and "discovery sha256  sha256:" in out
    assert "openapi version   1.0.0 (info.version)" in out  # not the document's "openapi": "3.1.0"
    assert "\x1b" not in out  # server text cannot drive the terminal


def test_inspect_json_matches_the_inspection_schema(capsys, monkeypatch):
    monkeypatch.setenv("KILN_TEST_ENV_TOKEN", "tok-cli-1")
    with FakeServer() as server:
        assert main(["openenv", "inspect", server.url, "--credential-env", "KILN_TEST_ENV_TOKEN", "--json"]) == 0
        assert all(auth == "Bearer tok-cli-1" for _, auth in server.request_headers)
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert report["schema"] == "kiln.openenv-inspection.v1"
    [environment] = report["environments"]
    assert environment["identity"]["authentication"] == "bearer"
    assert environment["identity"]["discovery_sha256"].startswith("sha256:")
    assert "tok-cli-1" not in captured.out + captured.err and "KILN_TEST_ENV_TOKEN" not in captured.out


def test_inspect_errors_are_one_line_and_non_zero(capsys):
    with FakeServer(health_status=404) as server:
        assert main(["openenv", "inspect", "--environment", server.url]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: openenv_unhealthy: ") and "\n" not in err
    assert main(["openenv", "inspect", "--environment", "ftp://x"]) == 1
    assert capsys.readouterr().err.startswith("error: openenv_invalid_url: ")
    assert main(["openenv", "inspect", "--environment", "http://127.0.0.1:1", "--credential-env", "KILN_UNSET_VAR_X"]) == 1
    assert capsys.readouterr().err.startswith("error: openenv_credential_invalid: ")


def test_tasks_says_unsupported_for_an_environment_without_the_task_api(capsys):
    with FakeServer() as server:  # the fake answers 404 for /{env}/splits: treated as a selection error
        assert main(["openenv", "tasks", server.url]) == 1
    assert capsys.readouterr().err.startswith("error: openenv_invalid_task_selection")


def test_inspect_of_a_server_that_wants_a_token_names_the_flag(capsys):
    with FakeServer(health_status=401) as server:
        assert main(["openenv", "inspect", "--environment", server.url]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: openenv_unauthorized: GET /health answered HTTP 401: the server requires credentials")
    assert "--credential-env VAR" in err and "\n" not in err
