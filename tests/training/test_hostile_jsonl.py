"""A JSONL corpus with a line nested 100000 levels deep, or an integer over 4300 digits, is a clean
refusal naming the line (never a RecursionError or a 500): in the corpus checker, through
POST /v1/train/grpo with dataset_path, and in `kiln train grpo --file`. A leading UTF-8 BOM is
accepted by the command as the server accepts it."""

import json

import pytest

from core.contracts.groups import GroupError, parse_jsonl
from kiln_project.cli import main as cli_main
from kiln_project.cli.train_cmd import load_request
from tests.training.conftest import GROUP

DEEP = "[" * 100_000 + "]" * 100_000
HUGE = '{"messages": [{"role": "user", "content": "x"}], "completions": [{"text": "5", "reward": 1' + "0" * 5000 + "}]}"
CASES = [(DEEP, "line 2: is nested too deeply"),
         (HUGE, "line 2: is not valid JSON (Exceeds the limit (4300 digits)")]


def _corpus(tmp_path, line: str):
    path = tmp_path / "groups.jsonl"  # the test settings make the temp folder a dataset root
    path.write_text(json.dumps(GROUP) + "\n" + line + "\n")
    return path


@pytest.mark.parametrize(("line", "message"), CASES)
def test_the_corpus_checker_names_the_line(line, message):
    with pytest.raises(GroupError) as err:
        parse_jsonl((json.dumps(GROUP) + "\n" + line + "\n").encode())
    assert str(err.value).startswith(message)


def test_nan_still_reaches_the_reward_check_that_names_the_field():
    groups, _ = parse_jsonl(json.dumps(GROUP).replace("1.0", "NaN").encode())
    assert groups[0]["completions"][0]["reward"] != groups[0]["completions"][0]["reward"]


@pytest.mark.django_db
@pytest.mark.parametrize(("line", "message"), CASES)
def test_dataset_path_with_hostile_json_is_a_400(api, tmp_path, line, message):
    from core.jobs.models import Job

    path = _corpus(tmp_path, line)
    response = api.post("/v1/train/grpo", data=json.dumps({"dataset_path": str(path)}),
                        content_type="application/json")
    assert response.status_code == 400, response.content[:500]
    body = response.json()["error"]
    assert body["code"] == "training_invalid_request" and message in body["message"]
    assert not Job.objects.exists()


@pytest.mark.parametrize(("line", "message"), [(DEEP, ":2: nested too deeply"),
                                               (HUGE, ":2: not valid JSON (Exceeds the limit (4300 digits)")])
def test_the_train_command_refuses_hostile_json_naming_the_line(tmp_path, capsys, line, message):
    path = _corpus(tmp_path, line)
    assert cli_main.main(["train", "grpo", "--file", str(path), "--url", "http://127.0.0.1:9"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: invalid_jsonl: ") and message in err and "unexpected_error" not in err


def test_the_train_command_refuses_a_whole_file_nested_too_deeply(tmp_path):
    from kiln_project.cli.client import CliError

    path = tmp_path / "deep.json"
    path.write_text(DEEP)
    with pytest.raises(CliError) as err:
        load_request(path)
    assert err.value.code == "invalid_jsonl" and "deep.json:1: nested too deeply" in err.value.message


def test_the_train_command_accepts_a_leading_bom(tmp_path):
    path = tmp_path / "groups.jsonl"
    path.write_bytes(b"\xef\xbb\xbf" + (json.dumps(GROUP) + "\n" + json.dumps(GROUP) + "\n").encode())
    assert load_request(path) == ({"groups": [GROUP, GROUP]}, True)
