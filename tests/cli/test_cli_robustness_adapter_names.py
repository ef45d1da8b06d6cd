"""Every `kiln adapters` command that takes a NAME checks it the same way before any request: "", "." and
".." are `invalid_path_segment` (as for any name in a path), any other name the server would refuse is
`invalid_adapter_name`. Before, `show ../x` reached the router (not_found: no route ...), `load ../x` the
server's check, and `verify ""` sent GET /v1/adapters//verify."""

from __future__ import annotations

import httpx
import pytest

from adapters.services import validate_adapter_name
from core.errors import KilnError
from kiln_project.cli import adapters_cmd, adapters_verify_cmd
from kiln_project.cli.client import CliError, adapter_name_arg
from tests.cli.recording_server import run_cli, serve_commands

COMMANDS = [["show"], ["download"], ["upload", "{NAME}", "a.tar.gz"], ["load"], ["unload"], ["activate"],
            ["delete"], ["verify"]]


@pytest.fixture
def server(monkeypatch):
    return serve_commands(monkeypatch, (adapters_cmd, adapters_verify_cmd), lambda request: httpx.Response(200, json={}))


def _argv(command, name):
    argv = ["adapters", *command] if "{NAME}" in command else ["adapters", *command, "{NAME}"]
    return [name if a == "{NAME}" else a for a in argv]


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(("name", "code"), [("../x", "invalid_adapter_name"), ("a/b", "invalid_adapter_name"),
                                            ("base", "invalid_adapter_name"), ("a b", "invalid_adapter_name"),
                                            ("x" * 65, "invalid_adapter_name"), ("", "invalid_path_segment"),
                                            ("..", "invalid_path_segment")])
def test_each_command_refuses_a_bad_name_alike(server, capsys, tmp_path, monkeypatch, command, name, code):
    monkeypatch.chdir(tmp_path)
    code_, out, err = run_cli(capsys, *_argv(command, name))
    assert server.requests == []
    assert code_ == 1 and out == ""
    assert err.startswith(f"error: {code}: ") and len(err.strip().splitlines()) == 1, err


def test_a_good_name_reaches_its_route(server, capsys):
    server.answer = lambda request: httpx.Response(200, json={"adapter": "math-r001", "ok": True, "links": []})
    code, _, err = run_cli(capsys, "adapters", "verify", "math-r001")
    assert code == 0, err
    assert server.requests == [("GET", "/v1/adapters/math-r001/verify")]


@pytest.mark.parametrize("name", ["math-r001", "a", "A.b_c-9", "x" * 64, "x" * 65, "base", "base2", "a..b", "a/b",
                                  "-a", ".a", "a b", "caf\u00e9", "a\n", "_a", "9"])
def test_the_cli_rule_is_the_servers(name):
    """The CLI mirrors adapters.services.validate_adapter_name (it cannot import it without Django set up)."""
    try:
        validate_adapter_name(name)
        server_accepts = True
    except KilnError:
        server_accepts = False
    try:
        adapter_name_arg(name)
        cli_accepts = True
    except CliError:
        cli_accepts = False
    assert cli_accepts == server_accepts
