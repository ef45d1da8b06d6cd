"""NaN and Infinity are not JSON: a float option given `nan`/`inf`, or a file Python's json module read with a
NaN in it, is one `invalid_json_value` line naming where the value is, before anything is sent. Before, httpx
refused the body with a bare ValueError and the CLI printed `unexpected_error`."""

from __future__ import annotations

import json

import httpx
import pytest

from kiln_project.cli import client, eval_cmd, openenv_runs_cmd, train_cmd
from kiln_project.cli.client import CliError, check_json_body
from tests.cli.recording_server import run_cli, serve_commands

GROUP = {"messages": [{"role": "user", "content": "hi"}],
         "completions": [{"text": "a", "reward": 1}, {"text": "b", "reward": float("nan")}]}


def _answer(request: httpx.Request) -> httpx.Response:
    if request.url.path == "/v1/train/grpo":  # the server cannot read the file: the CLI sends the groups inline
        return httpx.Response(400, json={"error": {"code": "training_invalid_request",
                                                   "message": "dataset_path: not a readable file", "hint": ""}})
    return httpx.Response(200, json={})


@pytest.fixture
def server(monkeypatch):
    return serve_commands(monkeypatch, (eval_cmd, openenv_runs_cmd, train_cmd), _answer)


@pytest.fixture
def nan_file(tmp_path):
    path = tmp_path / "body.json"
    path.write_text('{"a": NaN}')
    return path


def _refused(capsys, *argv) -> str:
    code, out, err = run_cli(capsys, *argv)
    assert code == 1 and out == "", (out, err)
    last = err.strip().splitlines()[-1]  # a grpo file sent inline prints its note line first
    assert last.startswith("error: invalid_json_value: ") and "not JSON numbers" in last, err
    assert "(hint: " in last and "unexpected_error" not in err, err
    return last


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "Infinity"])
def test_a_non_finite_temperature_is_refused(server, capsys, value):
    err = _refused(capsys, "eval", "run", "--suite", "x", f"--temperature={value}")
    assert "temperature" in err
    assert server.requests == []


def test_openenv_train_with_an_infinite_temperature(server, capsys):
    """openenv_cmd's own float type may refuse it at parsing (exit 2); if not, the client refuses the body."""
    try:
        _refused(capsys, "openenv", "train", "http://env.test", "--output-adapter", "x", "--temperature", "inf",
                 "--no-follow")
    except SystemExit as exc:
        assert exc.code == 2 and "finite" in capsys.readouterr().err
    assert all(method == "GET" for method, _ in server.requests)  # the POST never left


def test_a_nan_split_percent(server, capsys):
    _refused(capsys, "eval", "datasets", "split", "ds", "--train-percent", "nan")
    assert all(method == "GET" for method, _ in server.requests)  # the current split was read; no PUT left


@pytest.mark.parametrize("argv", [("eval", "suites", "create", "{F}"), ("openenv", "start", "--request", "{F}"),
                                  ("eval", "run", "--suite-file", "{F}")])
def test_a_file_holding_nan(server, capsys, nan_file, argv):
    err = _refused(capsys, *[str(nan_file) if a == "{F}" else a for a in argv])
    assert "nan at $" in err and ".a" in err
    assert server.requests == []


def test_grpo_groups_sent_inline_with_a_nan_reward(server, capsys, tmp_path):
    path = tmp_path / "groups.jsonl"
    path.write_text(json.dumps(GROUP) + "\n")  # json.dumps writes NaN, as a hand-edited file might
    err = _refused(capsys, "train", "grpo", "--file", str(path), "--adapter", "x")
    assert "$.groups[0].completions[1].reward" in err
    assert [path for _, path in server.requests] == ["/v1/train/grpo"]  # only the streamed attempt was sent


def test_the_walk_names_the_first_bad_value_and_passes_good_bodies():
    check_json_body({"a": [1, 2.5, {"b": None}], "c": "nan"})  # a string "nan" is fine
    with pytest.raises(CliError) as caught:
        check_json_body({"a": [0.0, {"b": float("-inf")}], "z": float("nan")})
    assert caught.value.code == "invalid_json_value" and "-inf at $.a[1].b" in caught.value.message


def test_a_deeply_nested_body_does_not_recurse(monkeypatch):
    body: object = float("nan")
    for _ in range(5000):
        body = [body]
    with pytest.raises(CliError, match=r"nan at \$\[0\]"):
        check_json_body(body)


def test_other_value_errors_are_not_reworded():
    """Only a non-finite number becomes invalid_json_value; any other ValueError httpx raises stays itself."""
    cyclic: list = []
    cyclic.append(cyclic)
    http = client._GuardedHttp(base_url="http://kiln.test")
    with pytest.raises(ValueError, match="Circular"):
        http.build_request("POST", "/v1/x", json=cyclic)
